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
    """The report as Markdown: its header, one section per part of the gold figures, then the
    agreement with the teacher. A report made without gold has that last section alone."""
    b = report["bootstrap"]
    if "checkers" in report:
        scope = f"{report['n_steps']} gold steps in {report['n_traces']} traces."
    else:
        scope = "No gold labels: agreement with the teacher only, which is not quality."
    lines = [
        "# stepgap evaluation report",
        "",
        f"{scope} Percentages, except kappa; CIs over {b['resamples']} resamples "
        f"(unit: {b['unit']}, seed {b['seed']}).",
        "",
        DEFINITIONS,
        "",
    ]
    if "checkers" in report:
        for section in SECTIONS:
            lines += section(report["checkers"])
    if "teacher_agreement" in report:
        lines += _teacher(report["teacher_agreement"], gold="checkers" in report)
    return "\n".join(lines) + "\n"


def _kappa(c: dict[str, Any]) -> str:
    """Kappa (not a percentage) with its CI."""
    kappa = _num(c["kappa"])
    if c["ci"].get("kappa") and None not in c["ci"]["kappa"]:
        kappa += f" [{_num(c['ci']['kappa'][0])}, {_num(c['ci']['kappa'][1])}]"
    return kappa


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
        kappa = _kappa(c)
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


FIDELITY = (
    "These figures measure fidelity to the teacher, not quality: a checker can agree with the "
    "teacher and both be wrong ({where}). They are the gold figures' metrics with the teacher's "
    "labels in place of gold, on the steps both labelled; **firing stage**: share of those steps "
    "whose tree path ends at the teacher's stage (path[-1]); **full path**: share whose whole "
    "path is the teacher's."
)


def _teacher(agreement: dict[str, Any], *, gold: bool) -> list[str]:
    """Each checker's agreement with the teacher, with the sentence that says what it is not."""
    where = "the gold figures above measure quality" if gold else "gold labels measure quality"
    lines = [
        f"## Agreement with the teacher ({agreement['teacher']})",
        "",
        FIDELITY.format(where=where),
        "",
        "| checker | sF1 | BA | kappa | sP | sR | typed acc | kappa CC | kappa IE | kappa MB "
        "| firing stage | full path | steps | missing | errors | teacher errors |",
        "|---|" + "---|" * 15,
    ]
    notes = []
    for name, c in agreement["checkers"].items():
        counts = f"{c['n_scored']} | {c['missing_steps']} | {c['error_steps']} | "
        counts += f"{c['teacher_error_steps']} |"
        if not c["n_scored"]:
            lines.append(f"| {name} | nothing to compare |" + " |" * 10 + f" {counts}")
            continue
        kt = c["kappa_per_type"]
        lines.append(
            f"| {name} | {_with_ci(c, 'sF1')} | {_with_ci(c, 'BA')} | {_kappa(c)} | "
            f"{_with_ci(c, 'sP')} | {_with_ci(c, 'sR')} | {_with_ci(c, 'typed_accuracy')} | "
            + " | ".join(_num(kt[t]) for t in GAP_TYPES)
            + f" | {_with_ci(c, 'firing_stage_agreement')} | {_pct(c['full_path_agreement'])} | "
            + counts
        )
        if c["path_note"]:
            notes.append(f"- {name}: {c['path_note']}.")
    return lines + (["", *notes] if notes else []) + [""]


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
SECTIONS = (_variants, _provenance, _distribution, _first_gap, _answer_gap, _sweep)
