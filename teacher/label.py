"""Labeling at scale: shard, resume, append verdicts as traces finish, show progress and cost.

The output file is the checkpoint. A rerun of the same command reads the verdicts already
written, skips every finished (trace, step) and writes only what is missing. A trace is written
as soon as its own judge answers are in, so a crash or a kill costs at most the traces whose
answers are still arriving, and the judge cache makes even those free: answers already received
are not asked again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stepgap.io import (
    ErrorReport,
    JsonlWriter,
    check_output,
    replacing,
    resume_keys,
    write_text,
)
from stepgap.progress import progress_bar
from stepgap.schema import LABELS, Trace, Verdict

from .checker import StepChecker
from .stream import hearing_answers

log = logging.getLogger(__name__)

_HEX_ID = re.compile(r"\b(?=[0-9a-f-]*\d)[0-9a-f-]{8,}\b")  # request ids, prompt hashes


def parse_shard(spec: str) -> tuple[int, int]:
    """`I/N` -> (I, N) with 0 <= I < N."""
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError(f"--shard must look like I/N (e.g. 0/4), got {spec!r}") from None
    if not 0 <= i < n:
        raise ValueError(f"--shard {spec}: need 0 <= I < N")
    return i, n


def shard_of(trace_id: str, shards: int) -> int:
    """A trace's shard from a hash of its id: stable across machines, orders and reruns."""
    return int(hashlib.sha256(trace_id.encode("utf-8")).hexdigest(), 16) % shards


def verdict_status(path: str | Path) -> dict[tuple[str, int], bool]:
    """(trace id, step) -> whether its verdict has a label, for every verdict in `path`; a
    half-written last line (a killed run) is ignored."""

    def status(rec: dict) -> tuple[tuple[str, int], bool]:
        return (str(rec["trace_id"]), int(rec["step"])), rec.get("label") is not None

    return dict(resume_keys(path, "verdict", status))


def finished_steps(path: str | Path) -> set[tuple[str, int]]:
    """(trace id, step) of every verdict already in `path`, labelled or failed."""
    return set(verdict_status(path))


def drop_superseded(path: str | Path) -> int:
    """Rewrite `path` keeping only the last verdict of each step (atomically: a crash leaves the
    old file or the new one); returns how many lines went. A failed verdict asked again is
    appended after its old line, which this removes once the run ends. A half-written last line
    goes too."""
    with open(path, "rb") as src:  # lines end at b"\n" alone: a JSON string may hold U+2028
        lines = list(src)
    last: dict[tuple[str, int], int] = {}
    for n, line in enumerate(lines):
        if line.endswith(b"\n") and line.strip():
            rec = json.loads(line)
            last[(str(rec["trace_id"]), int(rec["step"]))] = n
    keep = set(last.values())
    gone = {
        n
        for n, line in enumerate(lines)
        if not line.endswith(b"\n") or (line.strip() and n not in keep)
    }
    if not gone:  # nothing was asked again, or nothing new came: the file stays as it is
        return 0
    with replacing(path) as tmp, open(tmp, "wb") as dst:
        dst.writelines(line for n, line in enumerate(lines) if n not in gone)
        dst.flush()
        os.fsync(dst.fileno())
    return sum(1 for n in gone if lines[n].endswith(b"\n"))


@dataclass
class VerdictCounts:
    """What a run wrote: verdicts per label, failed checks and their most common reasons."""

    verdicts: int = 0
    labels: dict[str, int] = field(default_factory=dict)
    errors: int = 0  # verdicts without a label (judge or NLI failure)
    error_reasons: dict[str, int] = field(default_factory=dict)

    def add(self, verdict: Verdict) -> None:
        self.verdicts += 1
        if verdict.label is None:
            self.errors += 1
            # the first words name the kind of failure; ids and hashes in it vary by request
            error = _HEX_ID.sub("<id>", verdict.error or "unknown")
            reason = error if len(error) <= 80 else error[:80] + "..."
            self.error_reasons[reason] = self.error_reasons.get(reason, 0) + 1
        else:
            self.labels[verdict.label] = self.labels.get(verdict.label, 0) + 1

    @property
    def all_failed(self) -> bool:
        return self.verdicts > 0 and self.errors == self.verdicts

    def describe(self) -> str:
        """`28 verdicts: no_gap 15, CC 5, IE 4, MB 4; 0 failed` (+ the most common failure)."""
        labels = ", ".join(f"{lab} {self.labels.get(lab, 0)}" for lab in LABELS)
        text = f"{self.verdicts} verdicts: {labels}; {self.errors} failed"
        if self.error_reasons:
            reason, count = max(self.error_reasons.items(), key=lambda kv: kv[1])
            text += f" (most often, {count}x: {reason})"
        return text


@dataclass
class LabelSummary(VerdictCounts):
    traces: int = 0
    skipped_traces: int = 0  # already finished in the output
    retried: int = 0  # failed verdicts of an earlier run, asked again

    def write(self, path: str | Path, meter: object = None) -> None:
        """The counts and, with a cost meter, the judge's tokens and cost, as JSON."""
        cost = meter.as_dict() if meter is not None else None  # type: ignore[attr-defined]
        write_text(path, json.dumps({**asdict(self), "cost": cost}, indent=2))


def label_traces(
    traces: Iterable[Trace],
    checker: StepChecker,
    output: str | Path,
    *,
    shard: tuple[int, int] = (0, 1),
    limit: int | None = None,
    batch_size: int = 16,
    fsync: bool = False,
    progress: bool = True,
    summary_path: str | Path | None = None,
    retry_errors: bool = True,
) -> LabelSummary:
    """Check `traces` (this shard, at most `limit`) and append the missing verdicts to `output`.

    Steps already labelled in `output` are skipped; steps whose check failed in an earlier run
    are asked again (their old lines are removed first) unless `retry_errors` is False. With
    `summary_path`, the counts and the judge's cost are also written there as JSON.

    The judge's requests stream across traces (`Checker.check_stream`): a trace's verdicts
    are appended as soon as its own answers are in, so with a concurrent judge the file holds
    traces in the order they finish, each trace's steps together and in order; at most
    `batch_size` finished traces share one NLI call.
    """
    index, shards = shard
    summary = LabelSummary()
    status = verdict_status(output)
    retry = {k for k, labelled in status.items() if not labelled} if retry_errors else set()
    done = set(status) - retry

    pending: list[Trace] = []  # read whole before the output changes: a wrong input leaves it
    for t in traces:
        if shards > 1 and shard_of(t.id, shards) != index:
            continue
        if limit is not None and summary.traces >= limit:
            break
        summary.traces += 1
        assert t.steps is not None
        if all((t.id, i) in done for i in range(len(t.steps))):
            summary.skipped_traces += 1
        else:
            pending.append(t)
    summary.retried = sum(1 for t in pending for s in t.steps or [] if (t.id, s.index) in retry)
    if summary.retried:
        log.warning("%s: asking again for %d failed step(s)", output, summary.retried)
    try:
        _append_verdicts(pending, checker, output, done, summary, batch_size, fsync, progress)
    finally:  # a step asked again keeps its old line until its new one is written
        if retry and Path(output).exists():
            drop_superseded(output)
    if summary_path:
        summary.write(summary_path, checker.judge.meter if checker.judge is not None else None)
    return summary


def _append_verdicts(
    pending: list[Trace],
    checker: StepChecker,
    output: str | Path,
    done: set[tuple[str, int]],
    summary: LabelSummary,
    batch_size: int,
    fsync: bool,
    progress: bool,
) -> None:
    """Check `pending` and append each step's verdict that is not `done`, trace by trace."""
    meter = checker.judge.meter if checker.judge is not None else None
    total = sum(1 for t in pending for s in t.steps or [] if (t.id, s.index) not in done)
    stream = checker.check_stream(pending, batch_size=batch_size)
    with (
        progress_bar(total, "label", enabled=progress) as bar,
        JsonlWriter(output, append=True, fsync=fsync) as out,
        contextlib.closing(stream),  # its judge call ends before an error goes on
    ):
        # each trace is written as soon as its own judge answers are in and decided
        for trace, verdicts in stream:
            for v in verdicts:
                if (trace.id, v.step) in done:
                    continue
                out.write(v)
                done.add((trace.id, v.step))
                summary.add(v)
                bar.update(1)
            if meter is not None:
                bar.set_postfix(meter.postfix(), refresh=False)


def label_file(
    input_path: str | Path,
    checker: StepChecker,
    output: str | Path,
    report: ErrorReport | None = None,
    **options,
) -> LabelSummary:
    """`label_traces` over a traces file (raw or segmented; bad records go to `report`)."""
    from stepgap.segment import iter_traces

    check_output(output, input_path)
    return label_traces(iter_traces(input_path, report), checker, output, **options)


def check_file(
    input_path: str | Path,
    checker: StepChecker,
    output: str | Path,
    report: ErrorReport | None = None,
    *,
    batch_size: int = 64,
    progress: bool = True,
) -> VerdictCounts:
    """One verdict per step of every trace in `input_path`, written to `output` (replaced);
    returns what was written. When every step failed (a dead judge), `output` is left as it was
    (`counts.all_failed` says so). `label_file` is the resumable, sharded version."""
    from stepgap.segment import iter_traces

    check_output(output, input_path)  # before any model is asked: the input stays as it is
    traces = list(iter_traces(input_path, report))
    counts = VerdictCounts()
    total = sum(len(t.steps or []) for t in traces)
    with (
        progress_bar(total, "check", enabled=progress) as bar,
        hearing_answers(checker.judge, lambda request, result: bar.update(1)),
        JsonlWriter(output, input_path) as out,
    ):
        for start in range(0, len(traces), batch_size):
            for verdicts in checker.check(traces[start : start + batch_size]):
                for v in verdicts:
                    out.write(v)
                    counts.add(v)
            # the judge's answers moved the count as they came; its cache and a judge that
            # says nothing of its answers leave the rest to the verdicts
            bar.update(max(0, counts.verdicts - bar.n))
        if counts.all_failed:  # an earlier output is worth more than a file of failures
            out.close(failed=True)
    return counts


class MergeError(ValueError):
    """Shard outputs that do not join into one complete file: every problem, one per line."""


def merge_verdicts(
    inputs: Iterable[str | Path],
    output: str | Path,
    *,
    traces: str | Path | None = None,
    report: ErrorReport | None = None,
) -> VerdictCounts:
    """Join the outputs of `label --shard I/N` runs into one verdicts file (`stepgap merge`).

    Refuses, writing nothing, when a step has a verdict in two places (two shards, or twice in
    one file) or a trace's verdicts have a gap: a step missing between its first and last one,
    or, with `traces` (the labelled input), any step of any trace of that file. Verdicts keep
    the order of `traces` when given, else of `inputs`. The output is written atomically.
    """
    from stepgap.io import read_models

    report = report if report is not None else ErrorReport()
    inputs = list(inputs)
    given: dict[Path, str | Path] = {}
    for path in inputs:
        if Path(path).resolve() in given:
            raise ValueError(f"{path} is given twice (also as {given[Path(path).resolve()]})")
        given[Path(path).resolve()] = path
    problems: list[str] = []
    seen: dict[tuple[str, int], str] = {}
    verdicts: list[Verdict] = []
    for path in inputs:
        for line, v in read_models(path, Verdict, report):
            key = (v.trace_id, v.step)
            where = f"{path}:{line}"
            if key in seen:
                problems.append(
                    f"trace {key[0]!r} step {key[1]} is in {seen[key]} and again in {where}"
                )
                continue
            seen[key] = where
            verdicts.append(v)
    steps: dict[str, set[int]] = {}
    for v in verdicts:
        steps.setdefault(v.trace_id, set()).add(v.step)
    order: list[str] = list(steps)
    if traces is not None:
        from stepgap.segment import iter_traces

        expected = {t.id: len(t.steps or []) for t in iter_traces(traces, report)}
        for trace_id in steps.keys() - expected.keys():
            problems.append(f"trace {trace_id!r} has verdicts but is not in {traces}")
        for trace_id, n in expected.items():
            missing = sorted(set(range(n)) - steps.get(trace_id, set()))
            if missing and trace_id not in steps:
                problems.append(f"trace {trace_id!r} of {traces} has no verdicts in any input")
            elif missing:
                problems.append(f"trace {trace_id!r} is missing step(s) {_ranges(missing)}")
        order = [t for t in expected if t in steps] + [t for t in order if t not in expected]
    else:
        for trace_id, have in steps.items():
            missing = sorted(set(range(max(have) + 1)) - have)
            if missing:
                problems.append(f"trace {trace_id!r} is missing step(s) {_ranges(missing)}")
    if problems:
        more = f"\n... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise MergeError(
            f"cannot merge: {len(problems)} problem(s), nothing written\n"
            + "\n".join(problems[:20])
            + more
        )
    rank = {t: i for i, t in enumerate(order)}
    verdicts.sort(key=lambda v: (rank[v.trace_id], v.step))
    counts = VerdictCounts()
    sources = [*inputs, *([traces] if traces is not None else [])]
    with JsonlWriter(output, *sources) as out:
        for v in verdicts:
            out.write(v)
            counts.add(v)
    return counts


def _ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    parts: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(parts)
