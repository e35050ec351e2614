"""Options that several commands share, as dataclasses a command's own options class inherits
(the records it reads, its progress bar) or lists beside it (a Ray cluster), and the helpers
that turn them into a checker and a finished command's exit status."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stepgap.options import Options, at_least_one, option

if TYPE_CHECKING:
    from stepgap.teacher.build import CheckerConfig
    from stepgap.teacher.checker import StepChecker


# Exit statuses (`stepgap --help` lists them): 0 done; 1 nothing done (every step failed: a dead
# judge); 2 a usage or input error, nothing written; 3 done, but bad records were skipped.
EXIT_NOTHING = 1
EXIT_SKIPPED = 3

RECORDS = "bad records"


@dataclass(frozen=True, kw_only=True)
class RecordOptions(Options):
    """What a command that reads records does with one it cannot read."""

    errors: str | None = option(
        None, "also write skipped records here (JSONL)", metavar="FILE", group=RECORDS
    )
    allow_skipped: bool = option(
        False,
        f"exit 0 when bad records were skipped (default: exit {EXIT_SKIPPED}, so a pipeline "
        "sees that the output lacks them)",
        group=RECORDS,
    )


@dataclass(frozen=True, kw_only=True)
class ProgressOptions(Options):
    """A command that shows its progress (`stepgap.progress`: a bar on a terminal, a line every
    30 s in a log); `--no-progress` turns it off, and its libraries' bars with it."""

    # 30 s: stepgap.progress.LOG_INTERVAL (not imported here: tqdm would load with every parser)
    no_progress: bool = option(False, "no progress (a bar on a terminal, else a line every 30 s)")


def finish(args: RecordOptions, report: Any, done: int, what: str) -> int:
    """Print what was written and the skipped records (once, file:line: field: reason); exit
    `EXIT_SKIPPED` when any were skipped (the output lacks them), unless `--allow-skipped`."""
    print(f"stepgap: wrote {done} {what}", file=sys.stderr)
    if not report:
        return 0
    print(f"stepgap: skipped {len(report)} bad record(s):\n{report.summary()}", file=sys.stderr)
    if args.errors:
        report.write(args.errors)
    if args.allow_skipped:
        return 0
    print(
        f"stepgap: exit status {EXIT_SKIPPED}: records were skipped (--allow-skipped for 0)",
        file=sys.stderr,
    )
    return EXIT_SKIPPED


RAY = "Ray: checkers on a cluster (the `ray` extra)"


@dataclass(frozen=True, kw_only=True)
class RayOptions(Options):
    """A Ray cluster to run the checkers on, and what each of them holds."""

    ray: str | None = option(
        None,
        "run the checkers on the Ray cluster at ADDRESS (HOST:PORT or ray://HOST:PORT; alone: "
        "$RAY_ADDRESS, else a new local Ray); the models and files named by the options must "
        "be readable from every node",
        metavar="ADDRESS",
        group=RAY,
        nargs="?",
        const="",
    )
    ray_cpus: float = option(1.0, "CPUs per checker", metavar="N", group=RAY)
    ray_gpus: float = option(0.0, "GPUs per checker (1: one per GPU)", metavar="N", group=RAY)


@dataclass(frozen=True, kw_only=True)
class RayDataOptions(RayOptions):
    """Checking with Ray Data (`check`, `label`): one checker per actor."""

    ray_actors: int = option(2, "checker actors", metavar="N", group=RAY)

    def __post_init__(self) -> None:
        at_least_one("ray_actors", self.ray_actors)
        super().__post_init__()


@dataclass(frozen=True, kw_only=True)
class RayServeOptions(RayOptions):
    """Serving with Ray Serve (`serve`): replicas behind one proxy at --host/--port."""

    ray_replicas: int = option(1, "replicas", metavar="N", group=RAY)
    ray_max_replicas: int | None = option(
        None,
        "autoscale between --ray-replicas and N replicas on the requests in flight",
        metavar="N",
        group=RAY,
    )

    def __post_init__(self) -> None:
        at_least_one("ray_replicas", self.ray_replicas)
        at_least_one("ray_max_replicas", self.ray_max_replicas)
        super().__post_init__()


def join_ray(ray: RayOptions, config: CheckerConfig) -> Any:
    """Join the cluster of `--ray`, handing the judge's API key variable (if set here) to its
    workers; returns the `ray` module."""
    from stepgap.cluster import connect

    config.require_specs()  # here, not as a crash in every worker
    key = os.environ.get(config.api_key_env)
    return connect(ray.ray or None, env_vars={config.api_key_env: key} if key else None)


def checker(
    config: CheckerConfig,
    ray: RayDataOptions | None = None,
    *,
    batch_size: int = 16,
    progress: bool = True,
    online: bool = False,
) -> StepChecker:
    """The checker the options describe (`load_checker`: a bundle's, or the hybrid checker of
    the judge and NLI specs; `online` for a server), or with `--ray` a pool of them on a Ray
    cluster (`RayChecker`, `batch_size` traces per actor call; the judge's API key variable
    reaches its workers)."""
    from stepgap.export.offline import load_checker

    if ray is None or ray.ray is None:
        return load_checker(config, online=online)
    from stepgap.teacher.ray_checker import RayChecker

    join_ray(ray, config)
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = progress
    if not logging.getLogger().isEnabledFor(logging.INFO):  # without -v: Ray Data's INFO
        # blocks and tuning tips per run are noise
        logging.getLogger("ray.data").setLevel(logging.ERROR)
    return RayChecker(
        config,
        actors=ray.ray_actors,
        batch_size=batch_size,
        num_cpus=ray.ray_cpus,
        num_gpus=ray.ray_gpus,
        build=load_checker,
    )
