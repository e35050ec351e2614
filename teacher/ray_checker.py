"""Checking traces on a Ray cluster: Ray Data's `map_batches` over a pool of actors, one checker
per actor (one per GPU on a GPU cluster), each built in its actor from a `CheckerConfig`.

- `check_dataset(ds, config)`: a `ray.data.Dataset` of traces (rows with the trace fields, raw
  or segmented, or one `trace` column of JSON text) in, a Dataset of verdicts out (`trace_id`,
  `step`, `verdict`: the verdict's JSON), for users whose traces are already a Dataset.
- `RayChecker(config)`: the same pool behind the `Checker` interface (`check`, `check_stream`),
  so `label_traces` and `check_file` run on it unchanged (`stepgap label|check --ray`). The
  driver stays the only writer: it appends each trace's verdicts as the pool returns them, so
  every step is written once, and a rerun after a crash skips what was written.

Ray Data restarts an actor that dies and runs its batch again; what reached the output file
before is never asked again.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from stepgap.clock import TraceDeadline
from stepgap.schema import Trace, Verdict, to_plain
from stepgap.segment import segment_trace

from .build import CheckerConfig
from .checker import StepChecker

_COLUMNS = ("trace_id", "step", "verdict", "position")


Build = Callable[[CheckerConfig], StepChecker]
"""How an actor builds its checker from the configuration: `CheckerConfig.build` (specs), or
`stepgap.export.offline.load_checker` (a bundle too), which the command line passes."""


class CheckActor:
    """One checker in one Ray actor: a batch of traces in, one row per step verdict out."""

    def __init__(self, config: CheckerConfig, build: Build = CheckerConfig.build) -> None:
        self.checker = build(config)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        traces = [segment_trace(t) for t in _traces(batch)]
        positions = batch.get("position")
        rows: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
        for k, (trace, verdicts) in enumerate(zip(traces, self.checker.check(traces), strict=True)):
            for v in verdicts:
                rows["trace_id"].append(trace.id)
                rows["step"].append(v.step)
                rows["verdict"].append(v.model_dump_json())
                rows["position"].append(int(positions[k]) if positions is not None else -1)
        return rows


def _traces(batch: dict[str, Any]) -> list[Trace]:
    """The traces of a batch: a `trace` column of JSON text, or the trace fields as columns."""
    if "trace" in batch:
        return [Trace.model_validate_json(text) for text in batch["trace"]]
    names = [n for n in batch if n in Trace.model_fields]
    size = len(batch[names[0]]) if names else 0
    rows = [{n: _plain(batch[n][i]) for n in names} for i in range(size)]
    return [Trace.model_validate(row) for row in rows]


def _plain(value: Any) -> Any:
    """A numpy value of a Ray batch as plain Python (arrays of objects become lists)."""
    value = to_plain(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def check_dataset(
    ds: Any,
    config: CheckerConfig,
    *,
    actors: int = 2,
    batch_size: int = 16,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    build: Build = CheckerConfig.build,
) -> Any:
    """The verdicts of every trace of `ds`, checked by `actors` actors (`batch_size` traces per
    call, each actor holding `num_cpus` CPUs and `num_gpus` GPUs), each building its checker
    with `build`."""
    from ray.data import ActorPoolStrategy

    return ds.map_batches(
        CheckActor,
        fn_constructor_kwargs={"config": config, "build": build},
        batch_size=batch_size,
        batch_format="numpy",
        compute=ActorPoolStrategy(size=actors),
        num_cpus=num_cpus,
        num_gpus=num_gpus,
    )


class RayChecker(StepChecker):
    """A pool of checker actors behind the `StepChecker` interface; the judges (and their cost
    meters) live in the actors, so `judge` is None."""

    def __init__(
        self,
        config: CheckerConfig,
        *,
        actors: int = 2,
        batch_size: int = 16,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        build: Build = CheckerConfig.build,
    ) -> None:
        if actors < 1:
            raise ValueError(f"--ray-actors must be at least 1, got {actors}")
        self.config, self.actors, self.batch_size = config, actors, batch_size
        self.num_cpus, self.num_gpus, self.build = num_cpus, num_gpus, build

    @property
    def provenance(self) -> dict[str, object]:
        return {"ray": {"actors": self.actors, "config": dataclasses.asdict(self.config)}}

    def check_stream(
        self,
        traces: Iterable[Trace],
        *,
        batch_size: int | None = None,
        chunk_requests: int = 4096,
        stop: threading.Event | None = None,
        deadlines: Sequence[TraceDeadline | None] | None = None,
    ) -> Iterator[tuple[Trace, list[Verdict]]]:
        """(trace, its verdicts) as the pool finishes each trace (not in input order); each
        actor call checks `batch_size` traces (default: the pool's). One call is one pool: its
        actors start, build their checkers and stop, so hand it every trace at once.
        `chunk_requests` and `deadlines` are an in-process judge's, which the actors have of
        their own; `stop` ends the stream between batches."""
        import ray.data

        batch_size = batch_size or self.batch_size
        traces = list(traces)
        if not traces:
            return
        items = [{"trace": t.model_dump_json(), "position": i} for i, t in enumerate(traces)]
        ds = ray.data.from_items(items, override_num_blocks=max(1, len(items) // batch_size))
        out = check_dataset(
            ds,
            self.config,
            actors=self.actors,
            batch_size=batch_size,
            num_cpus=self.num_cpus,
            num_gpus=self.num_gpus,
            build=self.build,
        )
        waiting: dict[int, dict[int, Verdict]] = {}
        for batch in out.iter_batches(batch_size=None, batch_format="numpy"):
            if stop is not None and stop.is_set():
                return
            for position, text in zip(batch["position"], batch["verdict"], strict=True):
                verdict = Verdict.model_validate_json(text)
                got = waiting.setdefault(int(position), {})
                got[verdict.step] = verdict  # a batch run again after a lost actor: once
                trace = traces[int(position)]
                if len(got) == len(trace.steps or []):  # every step of this trace is back
                    yield trace, [got[k] for k in sorted(waiting.pop(int(position)))]

    def check(self, traces: Sequence[Trace]) -> list[list[Verdict]]:
        """Every trace's verdicts, in input order."""
        traces = list(traces)
        index = {id(t): i for i, t in enumerate(traces)}
        out: list[list[Verdict]] = [[] for _ in traces]
        for trace, verdicts in self.check_stream(traces):
            out[index[id(trace)]] = verdicts
        return out
