"""`report.md`: the paper's tables from a report dict."""

from __future__ import annotations

from typing import Any

from stepgap.schema import GAP_TYPES, LABELS


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def _with_ci(c: dict[str, Any], metric: str) -> str:
    value, ci = c.get(metric), c["ci"].get(metric)
    if value is None:
        return "n/a"
    if not ci or None in ci:
        return _pct(value)
    return f"{_pct(value)} [{_pct(ci[0])}, {_pct(ci[1])}]"


DEFINITIONS = """\
How to read it. A *gap* is a step labelled CC, IE or MB; the positive class is "gap".
- **sP, sR, sF1**: precision, recall and F1 of flagging gaps over steps. **Binary**: a CC
  step called IE counts as a hit.
- **BA**: balanced accuracy, (TPR + TNR) / 2, also binary. When the gold labels have no step of
  one class, that rate is undefined and counts as 0 (noted under the table).
- **typed acc**: share of scored steps whose label equals the gold label (CC/IE/MB/no_gap);
  **typed F1**: macro F1 over CC, IE and MB. These show whether the *type* is right.
- **Q-F1**: F1 over traces: gold positive = wrong final answer, predicted positive = at least
  one flagged step. **w** = wrong-answer rate; a checker that flags every step gets
  **2w/(1+w)**. A Q-F1 near that value with low sF1 or BA is the Q-F1 trap, not a good checker.
- **kappa**: Cohen's kappa on gap vs no gap (agreement beyond chance; 0 = chance, 1 = perfect).
- Brackets: 95% percentile bootstrap CIs."""


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: its header, then one section per part of the report."""
    checkers = report["checkers"]
    b = report["bootstrap"]
    lines = [
        "# stepgap evaluation report",
        "",
        f"{report['n_steps']} gold steps in {report['n_traces']} traces. Percentages, except "
        f"kappa; CIs over {b['resamples']} resamples (unit: {b['unit']}, seed {b['seed']}).",
        "",
        DEFINITIONS,
        "",
    ]
    for section in SECTIONS:
        lines += section(checkers)
    return "\n".join(lines) + "\n"


def _variants(checkers: dict[str, Any]) -> list[str]:
    """The headline table: every metric with its CI, per checker variant."""
    lines = [
        "## Checker variants",
        "",
        "| checker | sF1 | BA | typed acc | typed F1 | Q-F1 | 2w/(1+w) | kappa | sP | sR "
        "| scored | missing | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for name, c in checkers.items():
        if not c.get("scored", True):
            lines.append(
                f"| {name} | no scored step | | | | | | | | | 0 | {c['missing_steps']} | "
                f"{c['error_steps']} |"
            )
            continue
        kappa = _num(c["kappa"])
        if c["ci"].get("kappa") and None not in c["ci"]["kappa"]:
            kappa += f" [{_num(c['ci']['kappa'][0])}, {_num(c['ci']['kappa'][1])}]"
        lines.append(
            f"| {name} | {_with_ci(c, 'sF1')} | {_with_ci(c, 'BA')} | "
            f"{_pct(c['typed_accuracy'])} | {_pct(c['typed_macro_f1'])} | {_with_ci(c, 'QF1')} | "
            f"{_pct(c['QF1_flag_everything'])} | {kappa} | {_with_ci(c, 'sP')} | "
            f"{_with_ci(c, 'sR')} | {c['n_scored']} | {c['missing_steps']} | {c['error_steps']} |"
        )
        if c.get("BA_undefined"):
            notes.append(
                f"- {name}: BA's {c['BA_undefined']} is undefined (no gold step of that class) "
                "and counts as 0."
            )
    return lines + (["", *notes] if notes else [])


def _provenance(checkers: dict[str, Any]) -> list[str]:
    """Which judge and NLI model decided each variant's verdicts, with their notes."""
    lines = ["", "## Where the verdicts come from", "", "| checker | judge | NLI | note |",
             "|---|---|---|---|"]  # fmt: skip
    for name, c in checkers.items():
        for rec in c.get("provenance") or [{}]:
            judge, nli = rec.get("judge") or {}, rec.get("nli") or {}
            parts = [f"baseline {rec['baseline']}"] if "baseline" in rec else []
            parts += [
                f"{part}: {x['note']}"
                for part, x in (("judge", judge), ("NLI", nli))
                if x.get("note")
            ]
            note = "; ".join(parts)
            lines.append(
                f"| {name} | {judge.get('spec', '-')} | {nli.get('spec', '-')} | {note or '-'} |"
            )
    return lines


def _distribution(checkers: dict[str, Any]) -> list[str]:
    """Each variant's label distribution, its health and the per-type kappas."""
    lines = [
        "",
        "## Label distribution (% of steps) and health",
        "",
        "A checker is degenerate when IE is above 70% of steps, or CC or MB is never predicted.",
        "",
        "| checker | " + " | ".join(LABELS) + " | health | kappa CC | kappa IE | kappa MB |",
        "|---|" + "---|" * (len(LABELS) + 4),
    ]
    for name, c in checkers.items():
        kt = c["kappa_per_type"]
        if c["healthy"] is None:
            health = "n/a"
        else:
            health = "yes" if c["healthy"] else "DEGENERATE: " + "; ".join(c["health_issues"])
        lines.append(
            f"| {name} | "
            + " | ".join(_pct(c["distribution"][lab]) for lab in LABELS)
            + f" | {health} | "
            + " | ".join("n/a" if kt[t] is None else f"{kt[t]:.3f}" for t in GAP_TYPES)
            + " |"
        )
    return lines


def _first_gap(checkers: dict[str, Any]) -> list[str]:
    """The first gap type flagged on traces whose answer is wrong."""
    lines = [
        "",
        "## First gap on wrong-answer traces (% of those traces)",
        "",
        "| checker | " + " | ".join(GAP_TYPES) + " | none |",
        "|---|" + "---|" * (len(GAP_TYPES) + 1),
    ]
    for name, c in checkers.items():
        fg = c["first_gap"]
        if fg is None:
            continue
        lines.append(f"| {name} | " + " | ".join(_pct(fg[k]) for k in (*GAP_TYPES, "none")) + " |")
    return lines


def _answer_gap(checkers: dict[str, Any]) -> list[str]:
    """Per variant, answer correctness against whether a gap was flagged."""
    lines = ["", "## Answer correctness by gap detected", ""]
    for name, c in checkers.items():
        t = c["answer_gap"]
        if t is None:
            continue
        lines += [
            f"**{name}**",
            "",
            "| | gap flagged | no gap flagged |",
            "|---|---|---|",
            f"| wrong answer | {t['TP']} (TP) | {t['FN']} (FN) |",
            f"| correct answer | {t['FP']} (FP) | {t['TN']} (TN) |",
            "",
        ]
    return lines


def _silver(checkers: dict[str, Any]) -> list[str]:
    """Agreement with the silver reference, for the variants that have it."""
    silver = {n: c["silver"] for n, c in checkers.items() if c.get("silver")}
    if not silver:
        return []
    lines = [
        "## Agreement with the silver reference",
        "",
        "| checker | binary F1 | typed macro F1 | steps |",
        "|---|---|---|---|",
    ]
    for name, s in silver.items():
        lines.append(
            f"| {name} | {_pct(s['binary_f1'])} | {_pct(s['typed_macro_f1'])} | {s['n']} |"
        )
    return lines + [""]


def _sweep(checkers: dict[str, Any]) -> list[str]:
    """Per variant, the metrics when a gap is flagged only above a confidence threshold."""
    lines = ["## Threshold sweep (flag a gap only at confidence >= tau)", ""]
    for name, c in checkers.items():
        if not c["threshold_sweep"]:
            continue
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
    return lines


# The report's sections, in order
SECTIONS = (_variants, _provenance, _distribution, _first_gap, _answer_gap, _silver, _sweep)
