"""`report.md`: the paper's tables from a report dict."""

from __future__ import annotations

from typing import Any

from stepgap.data_builders.schema import GAP_TYPES, LABELS


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def _with_ci(c: dict[str, Any], metric: str) -> str:
    value, ci = c.get(metric), c["ci"].get(metric)
    if value is None:
        return "n/a"
    if not ci or None in ci:
        return _pct(value)
    return f"{_pct(value)} [{_pct(ci[0])}, {_pct(ci[1])}]"


def render_markdown(report: dict[str, Any]) -> str:
    checkers = report["checkers"]
    b = report["bootstrap"]
    lines = [
        "# stepgap evaluation report",
        "",
        f"{report['n_steps']} gold steps in {report['n_traces']} traces. Percentages; 95% "
        f"percentile bootstrap CIs over {b['resamples']} resamples (unit: {b['unit']}, "
        f"seed {b['seed']}).",
        "",
        "## Checker variants",
        "",
        "| checker | sP | sR | sF1 | BA | Q-F1 | kappa | flag-all Q-F1 | scored | missing | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in checkers.items():
        kappa = "n/a" if c["kappa"] is None else f"{c['kappa']:.3f}"
        lines.append(
            f"| {name} | {_with_ci(c, 'sP')} | {_with_ci(c, 'sR')} | {_with_ci(c, 'sF1')} | "
            f"{_with_ci(c, 'BA')} | {_with_ci(c, 'QF1')} | {kappa} | "
            f"{_pct(c['QF1_flag_everything'])} | {c['n_scored']} | {c['missing_steps']} | "
            f"{c['error_steps']} |"
        )
    lines += [
        "",
        "Q-F1 next to the flag-everything reference 2w/(1+w): a Q-F1 near that value with low "
        "sF1 or BA is the Q-F1 trap, not a good checker.",
        "",
        "## Label distribution (% of steps)",
        "",
        "| checker | " + " | ".join(LABELS) + " | healthy | kappa CC | kappa IE | kappa MB |",
        "|---|" + "---|" * (len(LABELS) + 4),
    ]
    for name, c in checkers.items():
        kt = c["kappa_per_type"]
        lines.append(
            f"| {name} | "
            + " | ".join(_pct(c["distribution"][lab]) for lab in LABELS)
            + f" | {'yes' if c['healthy'] else 'DEGENERATE'} | "
            + " | ".join("n/a" if kt[t] is None else f"{kt[t]:.3f}" for t in GAP_TYPES)
            + " |"
        )
    lines += [
        "",
        "## First gap on wrong-answer traces (% of those traces)",
        "",
        "| checker | " + " | ".join(GAP_TYPES) + " | none |",
        "|---|" + "---|" * (len(GAP_TYPES) + 1),
    ]
    for name, c in checkers.items():
        fg = c["first_gap"]
        lines.append(f"| {name} | " + " | ".join(_pct(fg[k]) for k in (*GAP_TYPES, "none")) + " |")
    lines += ["", "## Answer correctness by gap detected", ""]
    for name, c in checkers.items():
        t = c["answer_gap"]
        lines += [
            f"**{name}**",
            "",
            "| | gap flagged | no gap flagged |",
            "|---|---|---|",
            f"| wrong answer | {t['TP']} (TP) | {t['FN']} (FN) |",
            f"| correct answer | {t['FP']} (FP) | {t['TN']} (TN) |",
            "",
        ]
    silver = {n: c["silver"] for n, c in checkers.items() if c.get("silver")}
    if silver:
        lines += [
            "## Agreement with the silver reference",
            "",
            "| checker | binary F1 | typed macro F1 | steps |",
            "|---|---|---|---|",
        ]
        for name, s in silver.items():
            lines.append(
                f"| {name} | {_pct(s['binary_f1'])} | {_pct(s['typed_macro_f1'])} | {s['n']} |"
            )
        lines.append("")
    lines += ["## Threshold sweep (flag a gap only at confidence >= tau)", ""]
    for name, c in checkers.items():
        lines += [
            f"**{name}**",
            "",
            "| tau | sF1 | BA | IE % | flagged % |",
            "|---|---|---|---|---|",
        ]
        for r in c["threshold_sweep"]:
            lines.append(
                f"| {r['threshold']:.2f} | {_pct(r['sF1'])} | {_pct(r['BA'])} | "
                f"{_pct(r['IE_share'])} | {_pct(r['flagged_share'])} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"
