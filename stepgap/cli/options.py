"""Flags that several commands share: the judge, the NLI model, the bundle and the tree, made
from the fields of `CheckerConfig` and `TreeConfig` (their defaults, types, choices and help, so
there is one list of options); the reward and the error report; and the helpers that turn the
parsed flags back into those configurations."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from typing import TYPE_CHECKING, Any

from stepgap.reward import VARIANTS
from stepgap.teacher.build import BUNDLE, JUDGE, NLI, CheckerConfig
from stepgap.tree import TreeConfig

if TYPE_CHECKING:
    from stepgap.teacher import Checker


def finish(report: Any, errors_path: str | None, done: int, what: str) -> int:
    """Print the error report; exit 1 when nothing at all could be processed."""
    if report:
        print(f"stepgap: skipped {len(report)} bad record(s):\n{report.summary()}", file=sys.stderr)
        if errors_path:
            report.write(errors_path)
    print(f"stepgap: wrote {done} {what}", file=sys.stderr)
    return 0 if done or not report else 1


def add_errors_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--errors", metavar="FILE", help="also write skipped records here (JSONL)")


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


def _flag(p: Any, name: str, required: bool = False) -> None:
    """The flag of `CheckerConfig` field `name`: its type, default, choices and help."""
    info = CheckerConfig.model_fields[name]
    extra = dict(info.json_schema_extra or {})  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {"help": info.description, "default": info.default}
    if "metavar" in extra:
        kwargs["metavar"] = extra["metavar"]
    kind = info.annotation
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # `X | None`: the X
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if kind is bool:
        kwargs["action"] = "store_true"
    elif typing.get_origin(kind) is list:
        kwargs["action"] = "append"
    elif typing.get_origin(kind) is typing.Literal:
        kwargs["choices"] = list(typing.get_args(kind))
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


def checker(args: argparse.Namespace) -> Checker:
    """The checker the flags describe (`CheckerConfig.build`)."""
    return checker_config(args).build()


def add_reward_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--variant", choices=VARIANTS, default="typed_shape", help="docs/contract.md")
    p.add_argument("--lam", type=float, default=1.0, help="weight of the step rewards")
