"""Each checker's agreement with a teacher checker: fidelity to the teacher, never quality.

A student (a distilled judge, a PRM) is trained to copy a teacher's verdicts, so how closely it
does is measured against the teacher's labels, from the two prediction files alone: no gold
label is read. A checker can agree with its teacher and both be wrong; the gold figures of the
report measure quality.

The figures are the gold report's, with the teacher's labels in place of gold: sP, sR, sF1, BA
and kappa on gap vs no gap with bootstrap CIs (the same resampling unit and seed), typed
accuracy and kappa per gap type, plus how often the checker's tree path ends at the teacher's
firing stage (`path[-1]`) and how often the whole path is the teacher's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

import numpy as np

from stepgap.metrics import (
    binary_statistics,
    bootstrap_cis,
    bootstrap_units,
    step_metrics,
)
from stepgap.schema import GAP_TYPES


class PredStep(Protocol):
    """What a step's prediction gives the agreement figures (`report.PredStep` is one)."""

    trace_id: str
    step: int
    label: str | None
    path: list[str] | None


Key = tuple[str, int]
SINGLE_TOKEN_NOTE = (
    "its paths are one token (the firing stage alone, as a PRM writes them): only the firing "
    "stage is compared"
)


def teacher_agreement(
    teacher: Iterable[PredStep],
    preds: Iterable[PredStep],
    *,
    resamples: int = 2000,
    seed: int = 0,
    unit: Literal["step", "trace"] = "step",
) -> dict[str, Any]:
    """Agreement of `preds` with `teacher` on the steps both labelled. Teacher steps the checker
    lacks (`missing_steps`), failed (`error_steps`) or the teacher failed (`teacher_error_steps`)
    are counted, never scored; checker steps the teacher lacks are `extra_steps`."""
    ref, by_key = _by_step(teacher), _by_step(preds)
    shared = [k for k in sorted(ref) if k in by_key]
    scored = [k for k in shared if ref[k].label is not None and by_key[k].label is not None]
    out: dict[str, Any] = {
        "n_scored": len(scored),
        "missing_steps": sum(k not in by_key for k in ref),
        "error_steps": sum(by_key[k].label is None for k in shared),
        "teacher_error_steps": sum(ref[k].label is None for k in shared),
        "extra_steps": len(set(by_key) - set(ref)),
    }
    if not scored:
        return {**out, **_no_figures()}
    t = np.array([ref[k].label for k in scored], dtype=object)
    p = np.array([by_key[k].label for k in scored], dtype=object)
    out.update(step_metrics(list(t), list(p)))
    out["typed_accuracy"] = float(np.mean(t == p))
    same_stage, same_path, note = _path_matches(
        [ref[k].path for k in scored], [by_key[k].path for k in scored]
    )
    out["firing_stage_agreement"] = _share(same_stage)
    out["full_path_agreement"] = None if note else _share(same_path)
    out["n_paths"] = int(np.sum(~np.isnan(same_stage)))
    out["path_note"] = note

    n_units, rows = bootstrap_units([k[0] for k in scored], unit)
    stats = binary_statistics(t != "no_gap", p != "no_gap", rows)
    stats["typed_accuracy"] = _share_of(t == p, rows)
    stats["firing_stage_agreement"] = _share_of(same_stage, rows)
    out["ci"] = bootstrap_cis(stats, n_units, resamples, seed)
    return out


def agreement_with(
    teacher: str,
    checkers: Mapping[str, Sequence[PredStep]],
    **bootstrap: Any,
) -> dict[str, Any]:
    """`report.json`'s `teacher_agreement`: the teacher's name and one block per other checker
    (the teacher's own row would be agreement 1 by construction, so it has none)."""
    if teacher not in checkers:
        raise ValueError(f"--teacher {teacher!r} is not one of the --pred names")
    reference = checkers[teacher]
    return {
        "teacher": teacher,
        "checkers": {
            name: teacher_agreement(reference, preds, **bootstrap)
            for name, preds in checkers.items()
            if name != teacher
        },
    }


def _by_step(preds: Iterable[PredStep]) -> dict[Key, PredStep]:
    """One verdict per step; a step given twice is refused (`load_predictions` keeps the first)."""
    by_key: dict[Key, PredStep] = {}
    for p in preds:
        key = (p.trace_id, p.step)
        if key in by_key:
            raise ValueError(f"trace {p.trace_id!r} step {p.step} is predicted twice")
        by_key[key] = p
    return by_key


def _path_matches(
    teacher_paths: Sequence[list[str] | None], paths: Sequence[list[str] | None]
) -> tuple[np.ndarray, np.ndarray, str | None]:
    """Per step, 1.0 where the firing stage (or the whole path) equals the teacher's, 0.0 where
    not, nan where either verdict has no path; and the note when one side's paths are single
    tokens, where a whole path cannot match a tree's and only the firing stage means anything."""
    pairs = [(a or [], b or []) for a, b in zip(teacher_paths, paths, strict=True)]
    stage = np.array([a[-1] == b[-1] if a and b else np.nan for a, b in pairs], float)
    whole = np.array([a == b if a and b else np.nan for a, b in pairs], float)
    with_paths = [(a, b) for a, b in pairs if a and b]
    note = None
    if with_paths and all(len(b) == 1 for _, b in with_paths):
        note = SINGLE_TOKEN_NOTE
    elif with_paths and all(len(a) == 1 for a, _ in with_paths):
        note = "the teacher's " + SINGLE_TOKEN_NOTE.removeprefix("its ")
    elif not with_paths:
        note = "no step has a path in both files: paths are not compared"
    return stage, whole, note


def _share(matches: np.ndarray) -> float | None:
    """The share of 1.0 among the steps that have a value (None when none has)."""
    known = matches[~np.isnan(matches)]
    return float(known.mean()) if known.size else None


def _share_of(
    matches: np.ndarray, rows: Callable[[np.ndarray], np.ndarray]
) -> Callable[[np.ndarray], float]:
    """`_share` over the rows of resampled units, for `bootstrap_ci` (nan when none has a value)."""
    values = np.asarray(matches, dtype=float)

    def stat(idx: np.ndarray) -> float:
        share = _share(values[rows(idx)])
        return float("nan") if share is None else share

    return stat


def _no_figures() -> dict[str, Any]:
    """The block of a checker with no step labelled by both: counts, no figures."""
    empty = ("sP", "sR", "sF1", "BA", "BA_undefined", "kappa", "typed_accuracy",
             "firing_stage_agreement", "full_path_agreement")  # fmt: skip
    return {
        **dict.fromkeys(empty),
        "kappa_per_type": dict.fromkeys(GAP_TYPES),
        "n_paths": 0,
        "path_note": None,
        "ci": {},
        "note": "no step is labelled by both the teacher and this checker; nothing to compare",
    }
