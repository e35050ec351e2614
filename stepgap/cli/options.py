"""Flags that several commands share: the judge, the NLI model, the bundle and the tree, made
from the fields of `CheckerConfig` and `TreeConfig` (their defaults, types, choices and help, so
there is one list of options); the reward and the error report; and the helpers that turn the
parsed flags back into those configurations."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stepgap.registry import Default
from stepgap.teacher.build import BUNDLE, JUDGE, NLI, CheckerConfig
from stepgap.tree import TreeConfig

if TYPE_CHECKING:
    from stepgap.serving.reward_function import RewardOptions
    from stepgap.teacher.checker import StepChecker


# Exit statuses (`stepgap --help` lists them): 0 done; 1 nothing done (every step failed: a dead
# judge); 2 a usage or input error, nothing written; 3 done, but bad records were skipped.
EXIT_NOTHING = 1
EXIT_SKIPPED = 3


def positive_int(text: str) -> int:
    """An argparse type for a count (a batch, a limit, a number of workers): 0 or less is the
    flag's own one-line error, not a failure deep inside the run."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type for an amount (GiB, seconds) that must be more than 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def finish(args: argparse.Namespace, report: Any, done: int, what: str) -> int:
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


def backend_options(
    args: argparse.Namespace, add_arguments: Callable[[Any], None], *names: str
) -> dict[str, Any]:
    """Flags for a backend (`stepgap.registry`): a flag left at the default `add_arguments`
    declares for it goes only to backends that take it (`Default`); a flag the user set must
    be taken by the backend, or building it names the option."""
    declared = argparse.ArgumentParser(add_help=False)
    add_arguments(declared)
    return {
        n: Default(v) if v == declared.get_default(n) else v
        for n in names
        if (v := getattr(args, n)) is not None
    }


def add_errors_option(p: argparse.ArgumentParser) -> None:
    """`--errors FILE` and `--allow-skipped`, for every command that reads records."""
    p.add_argument("--errors", metavar="FILE", help="also write skipped records here (JSONL)")
    p.add_argument(
        "--allow-skipped",
        action="store_true",
        help=f"exit 0 when bad records were skipped (default: exit {EXIT_SKIPPED}, so a "
        "pipeline sees that the output lacks them)",
    )


def add_tree_options(p: Any, *, exclude: tuple[str, ...] = (), recorded: bool = False) -> None:
    """One flag per `TreeConfig` field, with its default, choices and help. `recorded`: no
    defaults (`relabel` starts from the config each verdict recorded, overriding what is given)."""
    for f in dataclasses.fields(TreeConfig):
        if f.name in exclude:
            continue
        meta = dict(f.metadata)
        kwargs: dict[str, Any] = {"help": meta["help"]}
        if "choices" in meta:
            kwargs["choices"] = meta["choices"]
        else:
            kwargs.update(type=type(f.default), metavar="X")
        if recorded:
            kwargs["help"] += " (default: as the verdicts recorded)"
        else:
            kwargs["default"] = f.default
        p.add_argument("--" + f.name.replace("_", "-"), **kwargs)


def tree_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The `TreeConfig` fields given on the command line (those with a value)."""
    names = (f.name for f in dataclasses.fields(TreeConfig))
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def tree_config(args: argparse.Namespace) -> TreeConfig:
    return TreeConfig(**tree_overrides(args))


def _flag(p: Any, name: str, required: bool = False, model: Any = CheckerConfig) -> None:
    """The flag of `model` field `name` (a `CheckerConfig` one by default): its type, default,
    choices and help."""
    info = model.model_fields[name]
    extra = dict(info.json_schema_extra or {})  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {"help": info.description, "default": info.default}
    if "metavar" in extra:
        kwargs["metavar"] = extra["metavar"]
    kind, constraints = info.annotation, list(info.metadata)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # `X | None`: the X
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if typing.get_origin(kind) is typing.Annotated:  # `PositiveInt | None`: int, Gt(0)
        kind, *more = typing.get_args(kind)
        constraints += more
    if kind is bool:
        kwargs["action"] = "store_true"
    elif typing.get_origin(kind) is list:
        kwargs["action"] = "append"
    elif typing.get_origin(kind) is typing.Literal:
        kwargs["choices"] = list(typing.get_args(kind))
    elif kind is int and any(getattr(m, "gt", None) == 0 for m in constraints):
        kwargs["type"] = positive_int  # PositiveInt: the flag's own error, as argparse gives it
    elif kind is float and any(getattr(m, "gt", None) == 0 for m in constraints):
        kwargs["type"] = positive_float
    elif kind is not str:
        kwargs["type"] = kind
    if required:
        kwargs["required"] = True
    p.add_argument("--" + name.replace("_", "-"), **kwargs)


def _group(title: str) -> list[str]:
    return [
        name
        for name, info in CheckerConfig.model_fields.items()
        if (info.json_schema_extra or {}).get("group") == title  # type: ignore[union-attr]
    ]


def add_judge_options(
    p: argparse.ArgumentParser, required: bool = True, spec: bool | None = None
) -> None:
    """The judge fields of `CheckerConfig`; `--judge` itself unless `spec` is False (`baseline`
    declares its own optional one)."""
    g = p.add_argument_group(JUDGE)
    for name in _group(JUDGE):
        if name == "judge":
            if spec if spec is not None else required:
                _flag(g, name, required=required)
        else:
            _flag(g, name)


def add_engine_options(p: Any) -> None:
    """`--engine` and `--kv-cache-gib` alone, for a command with a student judge of its own."""
    _flag(p, "engine")
    _flag(p, "kv_cache_gib")


def add_nli_options(p: argparse.ArgumentParser, required: bool = True) -> None:
    g = p.add_argument_group(NLI)
    for name in _group(NLI):
        _flag(g, name, required=required and name == "nli")
    add_tree_options(g)


def add_checker_options(p: argparse.ArgumentParser) -> None:
    """A checker from --judge and --nli, or the offline one from --bundle."""
    g = p.add_argument_group(BUNDLE)
    for name in _group(BUNDLE):
        _flag(g, name)
    add_judge_options(p, required=False, spec=True)
    add_nli_options(p, required=False)


def checker_config(args: argparse.Namespace) -> CheckerConfig:
    """The `CheckerConfig` of the flags a command declares (the others keep their defaults)."""
    names = CheckerConfig.model_fields.keys() - {"tree"}
    given = {n: getattr(args, n) for n in names if hasattr(args, n)}
    return CheckerConfig(**given, tree=tree_config(args))


def add_ray_options(p: argparse.ArgumentParser, serve: bool = False) -> None:
    """`--ray [ADDRESS]` and the resources of each checker: Ray Data actors (`label`, `check`)
    or, with `serve`, Ray Serve replicas."""
    unit = "replica" if serve else "actor"
    g = p.add_argument_group("Ray: checkers on a cluster (the `ray` extra)")
    g.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help=(
            "serve with Ray Serve on the cluster at ADDRESS, replicas behind one proxy at "
            "--host/--port"
            if serve
            else "check with Ray Data on the cluster at ADDRESS, one checker per actor"
        )
        + " (HOST:PORT or ray://HOST:PORT; alone: $RAY_ADDRESS, else a new local Ray); the "
        "models and files named by the flags must be readable from every node",
    )
    if serve:
        g.add_argument("--ray-replicas", type=positive_int, default=1, metavar="N", help="replicas")
        g.add_argument(
            "--ray-max-replicas",
            type=positive_int,
            default=None,
            metavar="N",
            help="autoscale between --ray-replicas and N replicas on the requests in flight",
        )
    else:
        g.add_argument(
            "--ray-actors", type=positive_int, default=2, metavar="N", help="checker actors"
        )
    g.add_argument("--ray-cpus", type=float, default=1.0, metavar="N", help=f"CPUs per {unit}")
    g.add_argument(
        "--ray-gpus", type=float, default=0.0, metavar="N", help=f"GPUs per {unit} (1: one per GPU)"
    )


def join_ray(args: argparse.Namespace, config: CheckerConfig) -> Any:
    """Join the cluster of `--ray`, handing the judge's API key variable (if set here) to its
    workers; returns the `ray` module."""
    from stepgap.cluster import connect

    config.require_specs()  # here, not as a crash in every worker
    key = os.environ.get(config.api_key_env)
    return connect(args.ray or None, env_vars={config.api_key_env: key} if key else None)


def checker(args: argparse.Namespace, *, online: bool = False) -> StepChecker:
    """The checker the flags describe (`load_checker`: a bundle's, or the hybrid checker of
    the judge and NLI specs; `online` for a server), or with
    `--ray` a pool of them on a Ray cluster (`RayChecker`; the judge's API key variable reaches
    its workers)."""
    from stepgap.export.offline import load_checker

    config = checker_config(args)
    if getattr(args, "ray", None) is None:
        return load_checker(config, online=online)
    from stepgap.teacher.ray_checker import RayChecker

    join_ray(args, config)
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = not getattr(args, "no_progress", False)
    if not getattr(args, "verbose", 0):  # Ray Data logs INFO blocks and tuning tips per run
        logging.getLogger("ray.data").setLevel(logging.ERROR)
    return RayChecker(
        config,
        actors=args.ray_actors,
        batch_size=args.batch_size,
        num_cpus=args.ray_cpus,
        num_gpus=args.ray_gpus,
        build=load_checker,
    )


def add_reward_options(p: argparse.ArgumentParser, training: bool = True) -> None:
    """The fields of `RewardOptions`; without `training` (stored verdicts), the variant and lam
    only."""
    from stepgap.serving.reward_function import RewardOptions

    g = p.add_argument_group("the reward")
    for name in RewardOptions.model_fields:
        if training or name != "on_failed_check":
            _flag(g, name, model=RewardOptions)


def reward_options(args: argparse.Namespace) -> RewardOptions:
    """The `RewardOptions` of the reward flags."""
    from stepgap.serving.reward_function import RewardOptions

    return RewardOptions(**{n: getattr(args, n) for n in RewardOptions.model_fields})
