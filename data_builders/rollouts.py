"""QA sets in, Search-R1-style rollouts out: the raw traces that `segment`, `label` and `reward`
read.

The loop is Search-R1's (`search_r1/llm_agent/generation.py`, `LLMGenerationManager.run_llm_loop`
in PeterGriffinJin/Search-R1), turn by turn for a wave of rollouts at once:

1. the policy continues each active response and stops at `</search>` or `</answer>`; the turn
   is cut after the first `</search>`, else after the first `</answer>` (`_postprocess_responses`);
2. the first `<search>...</search>` or `<answer>...</answer>` of the turn is its action
   (`postprocess_predictions`); all searches of the wave go to the retriever in one batch;
3. a search appends `\\n\\n<information>{docs}</information>\\n\\n`, the documents formatted
   `Doc {i+1}(Title: {title}) {text}\\n` (`_passages2string`); an answer ends the rollout; a turn
   with neither shows the policy Search-R1's "My previous action is invalid..." note and goes
   on (the note's literal tags would read as actions, so the trace's `response` leaves it out
   and `rollout.transcript` keeps the text with it);
4. after `max_turns` turns, one last turn runs without search (its search, if any, is left
   unanswered) and the rollout ends.

The prompt is Search-R1's template (`scripts/data_process/nq_search.py` / `infer.py`), unless a
Search-R1 parquet ships its own prompt, which is then used as is. The Hermes format instead gives
the model a `search` tool (`<tool_call>` / `<tool_response>`) and asks for the final answer in
`<answer>` tags.

Traces are appended to the output as they finish; a rerun skips every id already written, so a
crash or a kill loses only the rollouts in flight. This module is the run loop; the formats
(prompts, how a turn becomes an action) are in `rollout_formats.py`, the policies in
`policies.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepgap.feedback import FeedbackSource, Told
from stepgap.io import ErrorReport, JsonlWriter, resume_keys
from stepgap.options import Options
from stepgap.progress import progress_bar

from .policies import Policy, load_policy
from .qa import QAItem, iter_questions
from .retrieval import Retriever, format_passages, load_retriever
from .rollout_formats import (
    Rollout,
    load_format,
)

log = logging.getLogger(__name__)


@dataclass
class RolloutSummary:
    questions: int = 0
    traces: int = 0  # written by this run
    skipped: int = 0  # already in the output
    failed: int = 0  # policy or retriever error: not written, a rerun retries them
    searches: int = 0
    finish: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        ends = ", ".join(f"{k}: {v}" for k, v in sorted(self.finish.items())) or "none"
        return (
            f"{self.traces} trace(s) written, {self.skipped} already done, {self.failed} failed; "
            f"{self.searches} search(es); finished by {ends}"
        )


def finished_ids(path: str | Path) -> set[str]:
    """Ids of the traces already in `path`; a half-written last line is ignored."""
    return set(resume_keys(path, "trace", lambda rec: str(rec["id"])))


def trace_id(question_id: str, sample: int, n_per_question: int) -> str:
    """The question's own id for one rollout per question, `ID#k` for several."""
    return question_id if n_per_question == 1 else f"{question_id}#{sample}"


def run_rollouts(
    questions: Iterable[QAItem],
    policy: Policy,
    retriever: Retriever,
    output: str | Path,
    *,
    fmt: str = "search-r1",
    n_per_question: int = 1,
    max_turns: int = 4,
    topk: int = 3,
    wave_size: int = 64,
    limit: int | None = None,
    exclude_ids: Iterable[str] = (),
    retriever_name: str = "",
    progress: bool = True,
    on_trace: Callable[[dict[str, Any]], None] | None = None,
    feedback: FeedbackSource | None = None,
    feedback_wait: float = 0.0,
) -> RolloutSummary:
    """Roll out `n_per_question` traces per question and append each to `output` as it ends.

    Ids already in `output` are skipped (rerun the same call to resume). Rollouts advance in
    waves of `wave_size`, one policy call and one batched retrieval per turn, as Search-R1's
    `run_llm_loop` does. A policy or retriever failure fails the wave's unfinished rollouts
    (counted, logged, not written: a rerun retries them). With `feedback` (typed feedback,
    `stepgap.feedback`), each retrieval goes back with the note for its step when the step's
    verdict comes within `feedback_wait` seconds (0: only one already in) and is a gap.
    """
    style = load_format(fmt)
    if n_per_question < 1 or max_turns < 1 or topk < 1:
        raise ValueError("--n-per-question, --max-turns and --topk must be at least 1")
    summary = RolloutSummary()
    jobs = _pending(questions, n_per_question, limit, set(exclude_ids), output, summary)
    notes = Feedback(feedback, feedback_wait)
    with (
        progress_bar(len(jobs), "rollouts", "trace", enabled=progress) as bar,
        JsonlWriter(output, append=True) as out,
        contextlib.closing(notes),
    ):
        for start in range(0, len(jobs), wave_size):
            wave = [
                Rollout(item, k, tid, style.start(item), told=None if feedback is None else [])
                for item, k, tid in jobs[start : start + wave_size]
            ]
            _run_wave(wave, style, policy, retriever, max_turns, topk, summary, out, bar,
                      retriever_name, on_trace, notes)  # fmt: skip
    return summary


def _pending(
    questions: Iterable[QAItem],
    n_per_question: int,
    limit: int | None,
    excluded: set[str],
    output: str | Path,
    summary: RolloutSummary,
) -> list[tuple[QAItem, int, str]]:
    """(question, sample, trace id) of every rollout to run: the first `limit` questions but
    the `excluded`, less the traces already in `output`. Listed before any is run, so the
    progress has its total; the questions and those skipped are counted in `summary`."""
    done = finished_ids(output)
    jobs = []
    for n, item in enumerate(questions):
        if limit is not None and n >= limit:
            break
        if item.id in excluded:
            continue
        summary.questions += 1
        for k in range(n_per_question):
            tid = trace_id(item.id, k, n_per_question)
            if tid in done:
                summary.skipped += 1
            else:
                jobs.append((item, k, tid))
    return jobs


class Feedback:
    """Typed feedback in the loop: its source (None: off), how long a turn waits for it, and
    the event loop its calls run on (one for the run: a served checker keeps its
    connections)."""

    def __init__(self, source: FeedbackSource | None, wait: float = 0.0) -> None:
        self.source = source
        self.wait = wait
        self.loop = asyncio.new_event_loop() if source is not None else None

    def tell(self, style, rollouts: list[Rollout]) -> None:
        """After a wave's retrievals: each rollout's note, if any, goes back with its own. The
        wave's steps are sent at once and its notes waited for together (`wait` in all)."""
        if self.source is None or self.loop is None:
            return
        source = self.source

        async def each() -> list[Told]:
            return await asyncio.gather(
                *(source.tell(r.trace_id, r.item.question, r.response, self.wait) for r in rollouts)
            )

        for r, told in zip(rollouts, self.loop.run_until_complete(each()), strict=True):
            if r.told is not None:
                r.told.append(told)
            if told.note is not None:
                style.add_note(r, told.note)

    def forget(self, r: Rollout) -> None:
        if self.source is not None and self.loop is not None:
            self.loop.run_until_complete(self.source.drop(r.trace_id))

    def close(self) -> None:
        if self.loop is not None:
            self.loop.close()


def _run_wave(
    wave, style, policy, retriever, max_turns, topk, summary, out, bar, retriever_name, on_trace,
    feedback: Feedback,
) -> None:  # fmt: skip
    def finish(r: Rollout) -> None:
        feedback.forget(r)
        rec = r.record(policy.name, retriever_name, style.name, topk)
        out.write(rec)
        summary.traces += 1
        summary.searches += r.searches
        summary.finish[r.finish or "?"] = summary.finish.get(r.finish or "?", 0) + 1
        bar.update(1)
        bar.set_postfix(searches=summary.searches, refresh=False)
        if on_trace is not None:
            on_trace(rec)

    active = list(wave)
    try:
        for turn in range(max_turns + 1):
            if not active:
                break
            last = turn == max_turns  # Search-R1's final rollout: no search after it
            gens = policy.generate(active, style.stops)
            for r, g in zip(active, gens, strict=True):
                r.turns += 1
                style.step(r, g, last)
            searching = [r for r in active if r.pending_query is not None]
            if searching and not last:
                hits = retriever.search([r.pending_query for r in searching], topk)
                for r, h in zip(searching, hits, strict=True):
                    r.searches += 1
                    style.observe(r, format_passages(h))
                feedback.tell(style, searching)
            else:
                for r in searching:
                    style.observe(r, None)
            for r in active:
                if r.finish is None and last:
                    r.finish = "max_turns"
                if r.finish is not None:
                    finish(r)
            active = [r for r in active if r.finish is None]
    except Exception as exc:  # one bad wave never loses the traces already written
        summary.failed += len(active)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if not summary.traces and summary.failed == len(wave):  # nothing has ever worked
            raise ValueError(
                f"the first {len(wave)} rollout(s) all failed, so every one would: "
                f"{type(exc).__name__}: {reason} (is the policy server or the retriever up?)"
            ) from exc
        log.error("rollouts: %d rollout(s) failed: %s: %s", len(active), type(exc).__name__, reason)
        log.info("the failure in full", exc_info=True)  # shown with -v


def rollouts_file(
    qa: str | Path,
    policy: str | Policy,
    retriever: str | Retriever,
    output: str | Path,
    *,
    columns: str | dict[str, str] | None = None,
    split: str | None = None,
    subset: str | None = None,
    exclude_ids: Iterable[str | Path] = (),
    report: ErrorReport | None = None,
    policy_options: Options | Mapping[str, Any] | None = None,
    retriever_options: Options | Mapping[str, Any] | None = None,
    retriever_name: str | None = None,
    **options: Any,
) -> RolloutSummary:
    """`stepgap rollouts`: questions from `qa` (see `iter_questions`), traces to `output`.

    `policy` and `retriever` are spec strings (`hf:PATH`, `openai:MODEL`; an index folder or a
    Search-R1 server URL), built with their options, or ready objects; `exclude_ids` are files of question ids to leave out
    (one per line, or JSONL with `id` / `trace_id`, as `sft-data` reads them). Other options go
    to `run_rollouts`.
    """
    from .sft_data import read_ids

    excluded = set().union(*(read_ids(p) for p in exclude_ids)) if exclude_ids else set()
    questions = iter_questions(qa, columns=columns, split=split, subset=subset, report=report)
    ret_name = retriever_name or (
        retriever if isinstance(retriever, str) else type(retriever).__name__
    )
    ret = load_retriever(retriever, retriever_options) if isinstance(retriever, str) else retriever
    pol = load_policy(policy, policy_options) if isinstance(policy, str) else policy
    return run_rollouts(
        questions, pol, ret, output, exclude_ids=excluded, retriever_name=str(ret_name), **options
    )
