"""PNG plots of a report: label distribution bars, a CI forest plot, the threshold sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stepgap.data_builders.schema import LABELS

from .metrics import IE_DEGENERATE

FOREST_METRICS = ("sF1", "BA", "QF1", "kappa")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_distribution(report: dict[str, Any], path: str | Path) -> Path:
    plt = _pyplot()
    names = list(report["checkers"])
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(names), 3.6))
    width = 0.8 / len(LABELS)
    for j, label in enumerate(LABELS):
        shares = [100 * report["checkers"][n]["distribution"][label] for n in names]
        ax.bar([i + (j - 1.5) * width for i in range(len(names))], shares, width, label=label)
    ax.axhline(100 * IE_DEGENERATE, color="red", ls="--", lw=1, label="IE degenerate (70%)")
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_ylabel("% of steps")
    ax.set_title("Label distribution")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_forest(report: dict[str, Any], path: str | Path) -> Path:
    plt = _pyplot()
    names = list(report["checkers"])
    fig, axes = plt.subplots(
        1,
        len(FOREST_METRICS),
        figsize=(3 * len(FOREST_METRICS), 0.6 + 0.5 * len(names)),
        sharey=True,
    )
    for ax, metric in zip(axes, FOREST_METRICS, strict=True):
        for i, name in enumerate(names):
            c = report["checkers"][name]
            value, ci = c.get(metric), c["ci"].get(metric)
            if value is None:
                continue
            if ci and None not in ci:
                ax.plot(ci, [i, i], color="tab:blue", lw=2)
            ax.plot([value], [i], "o", color="black", ms=4)
        ax.set_title(metric)
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Point estimates with 95% bootstrap CIs", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_threshold_sweep(report: dict[str, Any], path: str | Path) -> Path:
    plt = _pyplot()
    fig, (ax_f1, ax_ie) = plt.subplots(1, 2, figsize=(9, 3.4))
    for name, c in report["checkers"].items():
        rows = c["threshold_sweep"]
        taus = [r["threshold"] for r in rows]
        ax_f1.plot(taus, [r["sF1"] for r in rows], marker="o", ms=3, label=name)
        ax_ie.plot(taus, [100 * r["IE_share"] for r in rows], marker="o", ms=3, label=name)
    ax_ie.axhline(100 * IE_DEGENERATE, color="red", ls="--", lw=1)
    ax_f1.set(xlabel="confidence threshold", ylabel="sF1", title="sF1 by threshold")
    ax_ie.set(xlabel="confidence threshold", ylabel="IE % of steps", title="IE share by threshold")
    ax_f1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def write_plots(report: dict[str, Any], out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    return [
        plot_distribution(report, out / "label_distribution.png"),
        plot_forest(report, out / "ci_forest.png"),
        plot_threshold_sweep(report, out / "threshold_sweep.png"),
    ]
