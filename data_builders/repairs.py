"""Step-level preference data from typed repairs (`stepgap repairs`).

For each trace's first gap (by its verdicts), the policy writes that step again `samples`
times from the text before it, with the gap's repair as an instruction it reads
(`stepgap.feedback.instruction_for`), and each new step is checked by the checker given, the
same one that labelled the traces. Then, in TRL's formats:

- `preference.jsonl`: a new step with no gap is *chosen* over the original gap step,
  *rejected*; the prompt is the text the policy continued (the instruction left out);
- `unpaired.jsonl`: every labelled step of the verdicts as a completion of the text before it,
  `label` true for no gap (KTO's unpaired format).

Every record carries its trace, step, gap type and the checker's provenance. The work of each
trace is appended to `repairs.jsonl` as it ends (a rerun skips those traces); the two data
files are made from it and the verdicts at the end of every run, each replaced whole.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepgap.feedback import instruction_for
from stepgap.io import ErrorReport, JsonlWriter, read_models, resume_keys
from stepgap.progress import progress_bar
from stepgap.schema import GAP_TYPES, Trace, Verdict
from stepgap.segment import SegmentationError, iter_traces, segment_trace
from stepgap.teacher.checker import StepChecker
from stepgap.teacher.relabel import group_by_trace

from .policies import Policy
from .qa import QAItem
from .retrieval import Retriever, format_passages
from .rollout_formats import Rollout, SearchR1Format

log = logging.getLogger(__name__)

WORK = "repairs.jsonl"
PREFERENCE = "preference.jsonl"
UNPAIRED = "unpaired.jsonl"


@dataclass
class RepairsSummary:
    traces: int = 0  # traces with a first gap, repaired by this run
    skipped: int = 0  # already in repairs.jsonl
    without_gap: int = 0  # every step no_gap (or a failed check before any gap): nothing to repair
    candidates: int = 0  # steps written again
    repaired: int = 0  # of those, checked no_gap
    failed: int = 0  # traces whose regeneration or check failed (a rerun retries them)
    pairs: int = 0  # preference.jsonl, this run's and earlier runs'
    unpaired: int = 0  # unpaired.jsonl

    def __str__(self) -> str:
        return (
            f"{self.traces} trace(s) repaired ({self.skipped} already done, {self.without_gap} "
            f"without a gap, {self.failed} failed); {self.repaired} of {self.candidates} new "
            f"step(s) without a gap; {self.pairs} pair(s), {self.unpaired} unpaired example(s)"
        )


@dataclass(frozen=True)
class Gap:
    """A trace's first gap: the trace, its step, and the verdict that found it."""

    trace: Trace
    verdict: Verdict

    @property
    def start(self) -> int:
        """Where the gap step starts in the response: the text before it is the prefix."""
        span = self.trace.steps[self.verdict.step].span  # type: ignore[index]
        assert span is not None  # segmentation gives every step its span
        return span[0]

    def item(self) -> QAItem:
        return item_of(self.trace)


def item_of(trace: Trace) -> QAItem:
    """The question a trace answers, as the rollout loop starts a rollout from it."""
    return QAItem(id=trace.id, question=trace.question, golden_answers=trace.golden_answers or [])


def first_gap(trace: Trace, verdicts: list[Verdict]) -> Gap | None:
    """The trace's first gap, or None when its steps up to a gap are not all known no-gap
    steps (a failed check before any gap says nothing about what follows)."""
    for v in verdicts:
        if v.label is None or v.step >= len(trace.steps or []):
            return None
        if v.label in GAP_TYPES:
            return Gap(trace, v)
    return None


def regenerate(
    gap: Gap, policy: Policy, retriever: Retriever, samples: int, topk: int
) -> tuple[str, list[Trace | None]]:
    """The prompt the policy continued, and its `samples` new versions of the gap step, each as
    the trace cut after it (None where the policy wrote no complete step)."""
    style, t = SearchR1Format(), gap.trace
    before = (t.response or "")[: gap.start]
    instruction = instruction_for(gap.verdict.label)  # type: ignore[arg-type]
    rollouts = []
    for k in range(samples):
        r = Rollout(gap.item(), k, f"{t.id}#repair{k}", style.start(gap.item()))
        r.response, r.prefix = before, f"{before}{instruction}\n"
        rollouts.append(r)
    prompt = policy.prompt_text(
        Rollout(gap.item(), 0, t.id, style.start(gap.item()), prefix=before)
    )
    for r, g in zip(rollouts, policy.generate(rollouts, style.stops), strict=True):
        style.step(r, g, last=False)
    searching = [r for r in rollouts if r.pending_query is not None]
    if searching:
        hits = retriever.search([r.pending_query for r in searching], topk)
        for r, h in zip(searching, hits, strict=True):
            style.observe(r, format_passages(h))
    return prompt, [_cut_after(r, t, gap.verdict.step) for r in rollouts]


def _cut_after(r: Rollout, t: Trace, index: int) -> Trace | None:
    """The new trace up to the end of its step `index`, segmented; None without that step."""
    try:
        new = segment_trace(Trace(id=r.trace_id, question=t.question, response=r.response,
                                  golden_answers=t.golden_answers))  # fmt: skip
    except SegmentationError:
        return None
    steps = new.steps or []
    if len(steps) <= index or steps[index].span is None:
        return None
    end = steps[index].span[1]  # type: ignore[index]
    return segment_trace(new.model_copy(update={"response": r.response[:end], "steps": None}))


def repair_record(gap: Gap, prompt: str, new: list[Trace | None], checker: StepChecker) -> dict:
    """One trace's repairs as `repairs.jsonl` keeps them: the original gap step and each new
    version with its verdict."""
    i, t = gap.verdict.step, gap.trace
    cut = [n for n in new if n is not None]
    verdicts = iter(checker.check(cut)) if cut else iter(())
    candidates = []
    for k, n in enumerate(new):
        if n is None:
            candidates.append({"sample": k, "text": None, "label": None, "error": "no step"})
            continue
        v = next(verdicts)[i]
        text = (n.response or "")[gap.start :]
        candidates.append({"sample": k, "text": text, "label": v.label, "path": v.path,
                           "error": v.error})  # fmt: skip
    span = t.steps[i].span  # type: ignore[index]
    return {
        "trace_id": t.id, "step": i, "gap_type": gap.verdict.label, "prompt": prompt,
        "rejected": (t.response or "")[span[0] : span[1]], "candidates": candidates,
        "checker": checker.provenance, "labelled_by": gap.verdict.checker,
    }  # fmt: skip


def check_policy(policy: Policy) -> None:
    """Nothing, for a policy whose prompts can be written as text (`Policy.prompt_text`), else
    its ValueError: said before any work."""
    item = QAItem(id="-", question="-")
    policy.prompt_text(Rollout(item, 0, "-", SearchR1Format().start(item)))


def preference_rows(record: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """TRL's preference rows of one trace's repairs: each new step without a gap, chosen over
    the original gap step."""
    for c in record["candidates"]:
        if c["label"] == "no_gap":
            yield {"prompt": record["prompt"], "chosen": c["text"], "rejected": record["rejected"],
                   "trace_id": record["trace_id"], "step": record["step"],
                   "gap_type": record["gap_type"], "sample": c["sample"],
                   "checker": record["checker"]}  # fmt: skip


def unpaired_rows(trace: Trace, verdicts: list[Verdict], policy: Policy) -> Iterator[dict]:
    """TRL's unpaired rows of one trace: each labelled step as the completion of the text
    before it, `label` true for no gap."""
    style, response = SearchR1Format(), trace.response or ""
    item = item_of(trace)
    for v in verdicts:
        if v.label is None or v.step >= len(trace.steps or []):
            continue
        start, end = trace.steps[v.step].span  # type: ignore[index, misc]
        r = Rollout(item, 0, trace.id, style.start(item), prefix=response[:start])
        yield {"prompt": policy.prompt_text(r), "completion": response[start:end],
               "label": v.label == "no_gap", "trace_id": trace.id, "step": v.step,
               "gap_type": v.label, "checker": v.checker}  # fmt: skip


def repairs_dir(
    traces: str | Path,
    verdicts: str | Path,
    policy: Policy,
    retriever: Retriever,
    checker: StepChecker,
    out_dir: str | Path,
    *,
    samples: int = 4,
    topk: int = 3,
    limit: int | None = None,
    report: ErrorReport | None = None,
    progress: bool = True,
) -> RepairsSummary:
    """`stepgap repairs` (see the module docstring): `samples` new versions of each trace's
    first gap step, then `preference.jsonl` and `unpaired.jsonl` in `out_dir`."""
    check_policy(policy)
    report = report if report is not None else ErrorReport()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    by_trace = group_by_trace(v for _, v in read_models(verdicts, Verdict, report))
    done = {r["trace_id"] for r in resume_keys(out / WORK, "repairs record", _record)}
    summary, gaps = RepairsSummary(), []
    kept = [t for t in iter_traces(traces, report) if t.id in by_trace]
    for t in kept[:limit]:
        gap = first_gap(t, by_trace[t.id])
        if gap is None:
            summary.without_gap += 1
        elif t.id in done:
            summary.skipped += 1
        else:
            gaps.append(gap)
    with (
        progress_bar(len(gaps), "repairs", "trace", enabled=progress) as bar,
        JsonlWriter(out / WORK, append=True) as work,
    ):
        for gap in gaps:
            try:
                prompt, new = regenerate(gap, policy, retriever, samples, topk)
                record = repair_record(gap, prompt, new, checker)
            except Exception as exc:  # one trace never loses the others; a rerun retries it
                summary.failed += 1
                log.error("repairs: trace %s failed: %s: %s", gap.trace.id, type(exc).__name__, exc)
            else:
                work.write(record)
                summary.traces += 1
                summary.candidates += samples
                summary.repaired += sum(c["label"] == "no_gap" for c in record["candidates"])
            bar.update(1)
    _write_data(out, kept[:limit], by_trace, policy, summary)
    return summary


def _record(record: dict[str, Any]) -> dict[str, Any]:
    """A `repairs.jsonl` record, or a KeyError for a line that is not one."""
    if not {"trace_id", "prompt", "rejected", "candidates"} <= record.keys():
        raise KeyError("not a repairs record")
    return record


def _write_data(out: Path, traces: list[Trace], by_trace: dict, policy: Policy,
                summary: RepairsSummary) -> None:  # fmt: skip
    """Both data files, each replaced whole: the pairs of every trace in repairs.jsonl, the
    unpaired rows of every trace read."""
    with JsonlWriter(out / PREFERENCE) as pairs:
        for record in resume_keys(out / WORK, "repairs record", _record):
            for row in preference_rows(record):
                pairs.write(row)
                summary.pairs += 1
    with JsonlWriter(out / UNPAIRED) as unpaired:
        for t in traces:
            for row in unpaired_rows(t, by_trace[t.id], policy):
                unpaired.write(row)
                summary.unpaired += 1
