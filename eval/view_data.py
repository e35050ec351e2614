"""What `stepgap view` shows, as data: per trace the question, answers and steps; per step and
checker the label, repair, path, confidence, reasoning, the evidence with the judge's quote
located as stage C finds it, the NLI calls and the reward brackets; and the summary figures.
`view_page.py` draws it, `view.py` reads the files."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from stepgap.options import one_of
from stepgap.reward_arithmetic import ON_FAILED_CHECK, exact_match, final_answer, no_reward_reason
from stepgap.schema import LABELS, Snippet, Trace, Verdict
from stepgap.tree import (
    AccumulatedEvidence,
    normalise_quote,
    normalise_quote_with_origin,
)

from .report import Gold, PredStep, build_report, provenance_notes

DEFAULT_PAGE_SIZE = 25
# The report's figures the summary shows (the rest stays in `stepgap eval`'s report.json).
SUMMARY_FIGURES = (
    "sP", "sR", "sF1", "BA", "QF1", "kappa", "QF1_flag_everything", "wrong_rate", "n_scored",
    "missing_steps", "error_steps", "healthy", "ci",
)  # fmt: skip


class RewardStepLine(BaseModel):
    """One step of a `stepgap reward` line: what the page shows of it."""

    model_config = ConfigDict(extra="ignore")

    step: int
    label: str | None = None
    base: float
    shape: float
    bracket: float


class RewardLine(BaseModel):
    """One line of a `stepgap reward` file (docs/contract.md, section 1)."""

    model_config = ConfigDict(extra="ignore")

    trace_id: str
    variant: str
    lam: float
    em: float
    reward: float | None  # null: no reward (`unavailable` says why)
    steps: list[RewardStepLine]
    failed_checks: int = 0
    unavailable: str | None = None  # why the trace has no reward (a failed step check)


# ------------------------------------------------------------------ the quote, as stage C sees it
def _utf16(text: str, index: int) -> int:
    """A Python string index as a JavaScript (UTF-16) one: characters beyond the BMP count 2."""
    return index + sum(1 for ch in text[:index] if ord(ch) > 0xFFFF)


def locate_quote(quote: str, text: str) -> tuple[int, int] | None:
    """Where `quote` occurs in `text` under stage C's comparison (whitespace collapsed, case
    folded), as a `[start, end)` range of `text` in Python indices; None when it does not."""
    needle = normalise_quote(quote)
    if not needle:
        return None
    haystack, origin = normalise_quote_with_origin(text)
    at = haystack.find(needle)
    if at < 0:
        return None
    return origin[at], origin[at + len(needle) - 1] + 1


class _EvidenceSoFar:
    """The evidence of steps 0..i as stage C holds it (`AccumulatedEvidence`, the very check of
    the tree), plus each snippet's normalised text with its way back, to show where a quote is.
    Grown step by step, so each snippet is normalised once per trace."""

    def __init__(self) -> None:
        self.stage_c = AccumulatedEvidence()
        self.fields: list[tuple[int, int, str, str, str, list[int]]] = []

    def extend(self, position: int, snippets: Sequence[Snippet]) -> None:
        self.stage_c.extend(snippets)
        for j, snippet in enumerate(snippets):
            for field in ("text", "title"):
                value = getattr(snippet, field)
                if value:
                    self.fields.append(
                        (position, j, field, value, *normalise_quote_with_origin(value))
                    )

    def quote(self, verdict: Verdict) -> dict[str, Any] | None:
        """The judge's quote: verbatim or not (stage C's own check), and every snippet of
        steps 0..i that holds it, with the `[start, end)` of the quote in JavaScript indices."""
        if verdict.judge is None:
            return None
        c = verdict.judge.step_1_quote_search
        quote = c.evidence_quote
        if not (c.found_quote and quote.strip()):
            return {"text": quote, "found": False, "verbatim": False, "hits": []}
        verbatim = self.stage_c.contains(quote)
        hits: list[dict[str, Any]] = []
        if verbatim:
            needle = normalise_quote(quote)
            seen: set[tuple[int, int]] = set()
            for k, j, field, value, normalised, origin in self.fields:
                at = normalised.find(needle)
                if at < 0 or (k, j) in seen:  # the text first, the title only if not in it
                    continue
                seen.add((k, j))
                start, end = origin[at], origin[at + len(needle) - 1] + 1
                hits.append(
                    {
                        "step": k,
                        "doc": j,
                        "field": field,
                        "start": _utf16(value, start),
                        "end": _utf16(value, end),
                    }
                )
        return {"text": quote, "found": True, "verbatim": verbatim, "hits": hits}


# ------------------------------------------------------------------ the page's data
def _verdict_view(verdict: Verdict | None, evidence: _EvidenceSoFar) -> dict[str, Any] | None:
    if verdict is None:
        return None
    j = verdict.judge
    reasoning = {}
    if j is not None:
        reasoning = {
            "A": j.step_minus1_alignment.alignment_reasoning,
            "B": j.step_0_abstention_check.abstention_reasoning,
            "C entity": j.step_1_quote_search.entity_match_reasoning,
            "C quote": j.step_1_quote_search.quote_search_reasoning,
        }
    return {
        "label": verdict.label,
        "repair": verdict.repair,
        "path": verdict.path,
        "confidence": verdict.confidence,
        "rationale": verdict.rationale,
        "error": verdict.error,
        "reasoning": reasoning,
        "quote": evidence.quote(verdict),
        "nli": [
            {
                "stage": c.stage,
                "premise": c.premise,
                "hypothesis": c.hypothesis,
                "probs": [c.probs.entailment, c.probs.neutral, c.probs.contradiction],
                "label": c.label,
            }
            for c in verdict.nli
        ],
    }


def _snippet(s: Snippet) -> dict[str, str]:
    return {"title": s.title, "text": s.text}


def _group(verdicts: Iterable[Verdict]) -> dict[tuple[str, int], Verdict]:
    return {(v.trace_id, v.step): v for v in verdicts}


def _reward_view(line: RewardLine, on_failed_check: str) -> dict[str, Any]:
    """A trace's reward as the page shows it: with a failed step check, no reward and why
    (`no_reward`, whatever the file says: a file written with failed checks scored 0 as well),
    or the number with those steps at 0 (`zero`), noted as such."""
    one_of("on_failed_check", on_failed_check, ON_FAILED_CHECK)
    total, unavailable, note = line.reward, line.unavailable, None
    if on_failed_check == "zero":
        unavailable = None
        if total is None:  # the file left it out: the same sum, each failed step at 0
            total = line.em + line.lam * sum(s.bracket for s in line.steps)
        if line.failed_checks and line.variant != "search_only":
            note = f"{line.failed_checks} failed step check(s) scored 0 (--on-failed-check zero)"
    elif unavailable is None:
        unavailable = no_reward_reason(line.variant, line.failed_checks, len(line.steps))
        if unavailable is None and total is None:
            unavailable = "the reward file gives none"
    return {
        "variant": line.variant,
        "lam": line.lam,
        "em": line.em,
        "total": None if unavailable else total,
        "unavailable": unavailable,
        "note": note,
    }


def _trace_view(
    trace: Trace,
    checkers: Mapping[str, Mapping[tuple[str, int], Verdict]],
    gold: Gold | None,
    reward: RewardLine | None,
    on_failed_check: str = "no_reward",
) -> dict[str, Any]:
    """One trace as the page draws it: its answer and EM, then each step with one verdict per
    checker (None where a checker has none), its gold label and its reward bracket."""
    steps = trace.steps or []
    answer = final_answer(trace.response, steps)
    bracket = {s.step: s for s in reward.steps} if reward else {}
    view_steps = []
    evidence = _EvidenceSoFar()
    for position, step in enumerate(steps):
        evidence.extend(position, step.evidence)
        verdicts = [by_step.get((trace.id, step.index)) for by_step in checkers.values()]
        gold_label = gold.steps.get((trace.id, step.index)) if gold else None
        compared = {v.label for v in verdicts if v is not None and v.label is not None}
        r = bracket.get(step.index)
        view_steps.append(
            {
                "index": step.index,
                "type": step.type,
                "claim": step.claim,
                "query": step.query,
                "answer": step.answer,
                "evidence": [_snippet(s) for s in step.evidence],
                "gold": gold_label,
                "disagree": len(compared | ({gold_label} if gold_label else set())) > 1,
                "reward": {"base": r.base, "shape": r.shape, "bracket": r.bracket} if r else None,
                "verdicts": [_verdict_view(v, evidence) for v in verdicts],
            }
        )
    labels = {
        "missing" if v is None else (v["label"] or "error")
        for s in view_steps
        for v in s["verdicts"]
    }
    sources = {}  # checker -> why its verdicts measure no real model (replayed, stand-in)
    for name, by_step in checkers.items():
        records = {
            repr(sorted(v.checker.items())): v.checker
            for step in steps
            if (v := by_step.get((trace.id, step.index))) is not None and v.checker
        }
        sources[name] = provenance_notes(list(records.values()))
    return {
        "id": trace.id,
        "question": trace.question,
        "golden": trace.golden_answers,
        "answer": answer,
        "em": exact_match(answer, trace.golden_answers),
        "gold_correct": gold.correct.get(trace.id) if gold else None,
        "reward": _reward_view(reward, on_failed_check) if reward else None,
        "labels": sorted(labels),
        "disagree": sum(s["disagree"] for s in view_steps),
        "sources": sources,
        "steps": view_steps,
    }


def trace_view(
    trace: Trace,
    checkers: Mapping[str, Iterable[Verdict]],
    *,
    gold: Gold | None = None,
    reward: RewardLine | None = None,
    on_failed_check: str = "no_reward",
) -> dict[str, Any]:
    """One segmented trace as the page draws it (a JSON-ready dict, without the raw response):
    what `stepgap serve` keeps for `GET /view`, so the page of recent traces is cheap to hold
    and to draw. `page_data` puts such dicts on one page."""
    by_checker = {name: _group(vs) for name, vs in checkers.items()}
    return _trace_view(trace, by_checker, gold, reward, on_failed_check)


def page_data(
    traces: Sequence[Mapping[str, Any]],
    checkers: Sequence[str],
    *,
    title: str = "stepgap view",
    page_size: int = DEFAULT_PAGE_SIZE,
    report: Mapping[str, Any] | None = None,
    has_gold: bool = False,
) -> dict[str, Any]:
    """The page's data from `trace_view` dicts (their verdicts in `checkers` order): the
    summary (label distribution, wrong answers, disagreements; `report`'s figures) and them."""
    if not checkers:
        raise ValueError("a view needs at least one checker's verdicts")
    if page_size < 1:
        raise ValueError(f"page_size must be at least 1, got {page_size}")
    counts: dict[str, Counter[str]] = {name: Counter() for name in checkers}
    sources: dict[str, dict[str, None]] = {name: {} for name in checkers}
    for t in traces:
        for name, notes in t.get("sources", {}).items():
            sources.setdefault(name, {}).update(dict.fromkeys(notes))
        for s in t["steps"]:
            for name, v in zip(checkers, s["verdicts"], strict=True):
                counts[name]["missing" if v is None else (v["label"] or "error")] += 1
    return {
        "title": title,
        "checkers": list(checkers),
        "has_gold": has_gold,
        "has_reward": any(t["reward"] is not None for t in traces),
        "page_size": page_size,
        "summary": {
            "traces": len(traces),
            "steps": sum(len(t["steps"]) for t in traces),
            "wrong_answers": sum(1 for t in traces if not t["em"]),
            "disagreeing_steps": sum(t["disagree"] for t in traces),
            "distribution": {name: dict(counts[name]) for name in checkers},
            "sources": {name: list(notes) for name, notes in sources.items() if notes},
            "labels": list(LABELS),
            "report": report,
        },
        "traces": list(traces),
    }


def view_data(
    traces: Sequence[Trace],
    checkers: Mapping[str, Iterable[Verdict]],
    *,
    gold: Gold | None = None,
    rewards: Mapping[str, RewardLine] | None = None,
    on_failed_check: str = "no_reward",
    title: str = "stepgap view",
    page_size: int = DEFAULT_PAGE_SIZE,
    resamples: int = 2000,
) -> dict[str, Any]:
    """Everything the page shows, as one JSON-ready dict (the page's script draws it).

    `traces` must be segmented (`iter_traces` does it); `checkers` maps a name to its verdicts
    (one per step; the page shows the checkers side by side in this order); `gold` adds gold
    labels, disagreement marks and the report's figures, computed by `build_report` on the
    traces of the page; `rewards` maps a trace id to its `stepgap reward` line, shown as no
    reward where a step check failed unless `on_failed_check="zero"` (as `stepgap reward`).
    """
    by_checker = {name: _group(vs) for name, vs in checkers.items()}
    rewards = rewards or {}
    views = [_trace_view(t, by_checker, gold, rewards.get(t.id), on_failed_check) for t in traces]
    figures = None
    if gold is not None:
        figures = _report_figures(gold, {t.id for t in traces}, by_checker, resamples)
    return page_data(
        views,
        list(checkers),
        title=title,
        page_size=page_size,
        report=figures,
        has_gold=gold is not None,
    )


def _report_figures(
    gold: Gold,
    ids: set[str],
    by_checker: Mapping[str, Mapping[tuple[str, int], Verdict]],
    resamples: int,
) -> dict[str, Any] | None:
    """The evaluation report's main figures for the traces on the page (`build_report`)."""
    on_page = Gold(
        steps={k: v for k, v in gold.steps.items() if k[0] in ids},
        correct={t: c for t, c in gold.correct.items() if t in ids},
    )
    if not on_page.steps:
        return None
    preds = {
        name: [
            PredStep(trace_id=t, step=s, label=v.label, confidence=v.confidence, error=v.error)
            for (t, s), v in verdicts.items()
            if t in ids
        ]
        for name, verdicts in by_checker.items()
    }
    report = build_report(on_page, preds, resamples=resamples)
    return {
        "n_steps": report["n_steps"],
        "n_traces": report["n_traces"],
        "bootstrap": report["bootstrap"],
        "checkers": {
            name: {k: c.get(k) for k in SUMMARY_FIGURES} for name, c in report["checkers"].items()
        },
    }
