"""PNG plots of a report: label distribution bars, a CI forest plot, the threshold sweep.

Every rate is drawn on one 0-1 scale (kappa may reach below 0), each label and each checker has
its own colour in every plot, and legends sit beside the axes, never on the data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stepgap.metrics import IE_DEGENERATE
from stepgap.schema import LABELS

from .colours import LABEL_COLOURS

FOREST_METRICS = ("sF1", "BA", "QF1", "kappa")
DEGENERATE_COLOUR = "#37474f"  # the IE-degenerate line: a grey no label has


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _checker_colours(names: list[str]) -> dict[str, Any]:
    plt = _pyplot()
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def _save(fig: Any, path: str | Path) -> Path:
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return Path(path)


def _legend_outside(ax: Any, **kwargs: Any) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize=7, **kwargs)


def plot_distribution(report: dict[str, Any], path: str | Path) -> Path:
    return _save(figure_distribution(report), path)


def figure_distribution(report: dict[str, Any]) -> Any:
    plt = _pyplot()
    names = list(report["checkers"])
    fig, ax = plt.subplots(figsize=(2.6 + 1.2 * len(names), 3.6))
    width = 0.8 / len(LABELS)
    for j, label in enumerate(LABELS):
        shares = [report["checkers"][n]["distribution"][label] for n in names]
        xs = [i + (j - (len(LABELS) - 1) / 2) * width for i in range(len(names))]
        ax.bar(xs, shares, width, label=label, color=LABEL_COLOURS[label][0])
    ax.axhline(IE_DEGENERATE, color=DEGENERATE_COLOUR, ls="--", lw=1, label="IE degenerate (0.70)")
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of steps")
    ax.set_title("Label distribution")
    _legend_outside(ax)
    fig.tight_layout()
    return fig


def plot_forest(report: dict[str, Any], path: str | Path) -> Path:
    return _save(figure_forest(report), path)


def figure_forest(report: dict[str, Any]) -> Any:
    plt = _pyplot()
    names = list(report["checkers"])
    colours = _checker_colours(names)
    fig, axes = plt.subplots(
        1,
        len(FOREST_METRICS),
        figsize=(2.8 * len(FOREST_METRICS), 0.9 + 0.5 * len(names)),
        sharey=True,
    )
    for ax, metric in zip(axes, FOREST_METRICS, strict=True):
        lowest = 0.0
        for i, name in enumerate(names):
            c = report["checkers"][name]
            value, ci = c.get(metric), c["ci"].get(metric)
            if value is None:
                continue
            if ci and None not in ci:
                ax.plot(ci, [i, i], color=colours[name], lw=2)
                lowest = min(lowest, ci[0])
            ax.plot([value], [i], "o", color=colours[name], ms=5)
            lowest = min(lowest, value)
        ax.set_xlim(max(-1.0, lowest - 0.05) if lowest < 0 else 0.0, 1.0)
        if metric == "kappa":
            ax.axvline(0, color="grey", lw=0.8, ls=":")
        ax.set_title(metric)
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Point estimates with 95% bootstrap CIs", fontsize=9)
    fig.tight_layout()
    return fig


def plot_threshold_sweep(report: dict[str, Any], path: str | Path) -> Path:
    return _save(figure_threshold_sweep(report), path)


def figure_threshold_sweep(report: dict[str, Any]) -> Any:
    plt = _pyplot()
    names = list(report["checkers"])
    colours = _checker_colours(names)
    fig, (ax_f1, ax_ie) = plt.subplots(1, 2, figsize=(10, 3.4))
    for name in names:
        rows = report["checkers"][name]["threshold_sweep"]
        if not rows:
            continue
        taus = [r["threshold"] for r in rows]
        ax_f1.plot(taus, [r["sF1"] for r in rows], marker="o", ms=3, color=colours[name])
        ax_ie.plot(
            taus, [r["IE_share"] for r in rows], marker="o", ms=3, color=colours[name], label=name
        )
    ax_ie.axhline(IE_DEGENERATE, color=DEGENERATE_COLOUR, ls="--", lw=1, label="IE degenerate")
    ax_f1.set(xlabel="confidence threshold", ylabel="sF1", title="sF1 by threshold", ylim=(0, 1))
    ax_ie.set(
        xlabel="confidence threshold", ylabel="IE share of steps", title="IE share by threshold"
    )
    ax_ie.set_ylim(0, 1)
    _legend_outside(ax_ie)
    fig.tight_layout()
    return fig


def write_plots(report: dict[str, Any], out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    return [
        plot_distribution(report, out / "label_distribution.png"),
        plot_forest(report, out / "ci_forest.png"),
        plot_threshold_sweep(report, out / "threshold_sweep.png"),
    ]
