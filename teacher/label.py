"""Labeling at scale: shard, resume, append verdicts as traces finish, show progress and cost.

The output file is the checkpoint. A rerun of the same command reads the verdicts already
written, skips every finished (trace, step) and writes only what is missing, so a crash or a
kill costs at most the batch in flight, and the judge cache makes even that batch free: answers
already received are not asked again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from stepgap.data_builders.io import ErrorReport, JsonlWriter
from stepgap.data_builders.schema import Trace

from .checker import Checker

log = logging.getLogger(__name__)


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


def finished_steps(path: str | Path) -> set[tuple[str, int]]:
    """(trace id, step) of every verdict already in `path`; a half-written last line is ignored."""
    done: set[tuple[str, int]] = set()
    path = Path(path)
    if not path.exists():
        return done
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                done.add((str(rec["trace_id"]), int(rec["step"])))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                if line.endswith("\n"):
                    raise ValueError(
                        f"{path}:{n}: not a verdict line; refusing to append to this file"
                    ) from None
    return done


@dataclass
class LabelSummary:
    traces: int = 0
    skipped_traces: int = 0  # already finished in the output
    verdicts: int = 0
    errors: int = 0  # verdicts without a label (judge or NLI failure)


def _batches(traces: Iterable[Trace], size: int) -> Iterator[list[Trace]]:
    batch: list[Trace] = []
    for t in traces:
        batch.append(t)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def label_traces(
    traces: Iterable[Trace],
    checker: Checker,
    output: str | Path,
    *,
    shard: tuple[int, int] = (0, 1),
    limit: int | None = None,
    batch_size: int = 16,
    fsync: bool = False,
    progress: bool = True,
) -> LabelSummary:
    """Check `traces` (this shard, at most `limit`) and append the missing verdicts to `output`."""
    index, shards = shard
    summary = LabelSummary()
    done = finished_steps(output)

    def pending() -> Iterator[Trace]:
        taken = 0
        for t in traces:
            if shards > 1 and shard_of(t.id, shards) != index:
                continue
            if limit is not None and taken >= limit:
                return
            taken += 1
            summary.traces += 1
            assert t.steps is not None
            if all((t.id, i) in done for i in range(len(t.steps))):
                summary.skipped_traces += 1
                continue
            yield t

    meter = getattr(checker.judge, "meter", None)
    bar = tqdm(desc="label", unit="step", disable=not progress, dynamic_ncols=True)
    with JsonlWriter(output, append=True, fsync=fsync) as out:
        for batch in _batches(pending(), batch_size):
            for trace, verdicts in zip(batch, checker.check(batch), strict=True):
                for v in verdicts:
                    if (trace.id, v.step) in done:
                        continue
                    out.write(v)
                    done.add((trace.id, v.step))
                    summary.verdicts += 1
                    summary.errors += v.label is None
                    bar.update(1)
            if meter is not None:
                bar.set_postfix(meter.postfix(), refresh=False)
    bar.close()
    return summary


def label_file(
    input_path: str | Path,
    checker: Checker,
    output: str | Path,
    report: ErrorReport | None = None,
    **options,
) -> LabelSummary:
    """`label_traces` over a traces file (raw or segmented; bad records go to `report`)."""
    from stepgap.data_builders.segment import iter_traces

    return label_traces(iter_traces(input_path, report), checker, output, **options)
