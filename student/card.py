"""The student adapter's model card (README.md next to the adapter, the page the Hub shows), and
the folder made fit to publish right before each of the Trainer's uploads.

The card says what the adapter is, its base, the recipe, the data, the metrics logged, how to
load it and its limits (the method's, quoted from the bundle card's template: one text for both).
Models and files are named as `stepgap.models.display_ref` names them: a hub id as it is, a local
path by its last part only. The token never reaches a card: nothing here reads it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from stepgap.hub_access import CARD, LICENSE, template_section
from stepgap.models import display_ref, stand_in_note

from .recipe import Recipe, recipe_value

TAGS = ["stepgap", "trl", "sft", "lora"]
# The recipe keys a reader needs to judge or reproduce the run (the rest are bookkeeping).
RECIPE_KEYS = (
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "load_in_4bit",
    "dtype",
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "num_train_epochs",
    "max_steps",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "weight_decay",
    "max_grad_norm",
    "max_length",
    "packing",
    "seed",
)
# Logged by TRL's SFTTrainer; the card shows the last value of each (train_loss: the run's mean,
# loss: the last logged window's).
METRIC_KEYS = (
    "train_loss",
    "loss",
    "mean_token_accuracy",
    "eval_loss",
    "eval_mean_token_accuracy",
    "epoch",
)
PUBLISHED_META_KEYS = ("base_model", "init_adapter", "nli_model")  # names, not local paths


def hub_base(ref: str) -> str | None:
    """`ref` if it names a Hub model, else None: a local folder, a .gguf file or a packaged model
    (`pypi:`, `tiny-random:`) has no Hub page, and the Hub refuses a card whose `base_model` is
    not a model id."""
    if os.path.exists(ref) or ref.endswith(".gguf") or ":" in ref or display_ref(ref) != ref:
        return None
    return ref


def training_metrics(log_history: list[dict[str, Any]]) -> dict[str, float]:
    """The last logged value of each metric in METRIC_KEYS (the Trainer's `state.log_history`)."""
    last: dict[str, float] = {}
    for entry in log_history:
        for key in METRIC_KEYS:
            if isinstance(entry.get(key), (int, float)):
                last[key] = float(entry[key])
    out = {key: last[key] for key in METRIC_KEYS if key in last}
    if log_history:
        out["global_step"] = max(int(e.get("step", 0)) for e in log_history)
    return out


def data_counts(train_set: Any, eval_set: Any = None) -> dict[str, int]:
    """Examples (one per step) and, where the data set keeps them, traces per split."""
    counts: dict[str, int] = {}
    for name, split in (("train", train_set), ("held_out", eval_set)):
        if split is None:
            continue
        counts[f"{name}_examples"] = len(split)
        if "trace_id" in split.column_names:
            counts[f"{name}_traces"] = len(set(split["trace_id"]))
    return counts


def _stand_in(base: str) -> str | None:
    config = Path(base) / "config.json"
    if config.is_file():
        return stand_in_note(json.loads(config.read_text(encoding="utf-8")))
    return None


def _table(rows: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return ", ".join(map(str, v)) if isinstance(v, list) else str(v)

    return "| key | value |\n| --- | --- |\n" + "\n".join(
        f"| {k} | {fmt(v)} |" for k, v in rows.items()
    )


def render_adapter_card(
    recipe: Recipe,
    *,
    base: str,
    counts: dict[str, int],
    data_meta: dict[str, Any],
    metrics: dict[str, float],
    world_size: int = 1,
) -> str:
    """README.md for the adapter trained with `recipe` on `base` (the loadable reference the
    adapter_config names; only its display form is written)."""
    script, training, _ = recipe
    keys = {k: recipe_value(recipe, k) for k in RECIPE_KEYS}
    keys["effective_batch_size"] = (
        training.per_device_train_batch_size * training.gradient_accumulation_steps * world_size
    )
    lines = [
        *_card_intro(recipe, base),
        *["", "## Training recipe", "", _table(keys)],
        *_card_data(script, counts, data_meta),
        *_card_metrics(metrics),
        *_card_usage(training.hub_model_id or "USER/NAME", on_hub=hub_base(base) is not None),
    ]
    return "\n".join(lines)


def _card_intro(recipe: Recipe, base: str) -> list[str]:
    """The card's metadata block, its title and what the adapter is."""
    script, training, model_args = recipe
    shown, on_hub = display_ref(base), hub_base(base)
    four_bit = model_args.load_in_4bit
    kind = (
        f"QLoRA adapter (trained on a 4-bit {model_args.bnb_4bit_quant_type} base)"
        if four_bit
        else "LoRA adapter"
    )
    meta: dict[str, Any] = {"library_name": "peft", "license": LICENSE}
    if on_hub:
        meta["base_model"] = on_hub
    meta["pipeline_tag"] = "text-generation"
    meta["tags"] = TAGS + (["qlora"] if four_bit else [])
    where = "" if on_hub else " (not a Hub model: give the base yourself when loading)"
    note = _stand_in(base)
    lines = [
        "---",
        yaml.safe_dump(meta, sort_keys=False).strip(),
        "---",
        "",
        f"# {training.hub_model_id or 'stepgap student judge'}",
        "",
        f"A **stepgap** student judge: a {kind} on `{shown}`{where}, trained with TRL's "
        "`SFTTrainer` to write, for one step of a search agent's reasoning trace, the teacher's "
        "judge JSON (stages A-C of stepgap's decision tree) with the pipeline path and the gap "
        "label (no-gap, CC, IE or MB). Alone it is half a checker: stages D-E need an NLI model "
        "(`stepgap check --nli`), and `stepgap export` bundles both for offline use."
        + (f" **The base is a {note}; these weights check nothing real.**" if note else ""),
    ]
    if script.init_adapter:
        lines += [
            "",
            f"It continues adapter `{display_ref(script.init_adapter)}` (hard-negative "
            "augmentation: `stepgap mine --augment-config`).",
        ]
    return lines


def _card_data(script: Any, counts: dict[str, int], data_meta: dict[str, Any]) -> list[str]:
    """What the adapter was trained on: the SFT data, its counts, prompt and NLI features."""
    from stepgap.teacher.prompt import PROMPT_VERSION

    data = {"source": f"`{display_ref(script.dataset)}`", **counts}
    if script.max_train_examples is not None:
        data["max_train_examples"] = script.max_train_examples
    data["prompt_version"] = data_meta.get("prompt_version", PROMPT_VERSION)
    features = data_meta.get("nli_features")
    data["nli_features"] = (
        f"yes ({display_ref(data_meta['nli_model'])})"
        if features and data_meta.get("nli_model")
        else "yes"
        if features
        else "no"
    )
    return [
        "",
        "## Training data",
        "",
        "Teacher verdicts turned into prompt-completion chat examples (`stepgap sft-data`), one "
        "per step, split by trace; the loss is on the completion only.",
        "",
        _table(data),
    ]


def _card_metrics(metrics: dict[str, float]) -> list[str]:
    """The logged SFT metrics, or that there are none."""
    lines = ["", "## Training metrics", ""]
    if not metrics:
        return [*lines, "No metrics were logged."]
    return [
        *lines,
        "SFT losses and token accuracy: how closely the student imitates the teacher, not how "
        "well it finds gaps (`stepgap eval` measures that against gold labels).",
        "",
        _table(metrics),
    ]


def _card_usage(name: str, *, on_hub: bool) -> list[str]:
    """How to use the adapter (stepgap, or peft alone), its license and limitations; a base
    that is not on the Hub must be given when loading."""
    base_arg = "" if on_hub else " --student-base BASE"
    if on_hub:  # peft finds the base through adapter_config.json
        peft_import = "AutoPeftModelForCausalLM"
        peft_load = [f'model = AutoPeftModelForCausalLM.from_pretrained("{name}")']
    else:
        peft_import = "PeftModel"
        peft_load = [
            'base = AutoModelForCausalLM.from_pretrained("BASE")  # the base, wherever it is',
            f'model = PeftModel.from_pretrained(base, "{name}")',
        ]
    return [
        "",
        "## How to use",
        "",
        "```bash",
        f"hf download {name} --local-dir student",
        f"stepgap check traces.jsonl --judge student:student{base_arg} "
        "--nli MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli -o verdicts.jsonl",
        "```",
        "",
        "`stepgap_student.json` in the folder says how the student is prompted (prompt version, "
        "NLI features); `stepgap check` reads it. With peft alone:",
        "",
        "```python",
        f"from peft import {peft_import}",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        *peft_load,
        f'tokenizer = AutoTokenizer.from_pretrained("{name}")  # the trained chat template',
        "```",
        "",
        "## License and limitations",
        "",
        f"The adapter is released under {LICENSE}; the base model's own license applies to the "
        "base weights. It was trained on teacher verdicts, not on human labels, so it carries "
        "the teacher's errors as well as its own.",
        "",
        template_section("Limitations"),
        "",
    ]


def publish_meta(folder: Path) -> dict[str, Any]:
    """`folder`'s stepgap_student.json with its models named as published (never a path of this
    machine), rewritten in place; {} when there is none. Bundles and Hub uploads both use it."""
    from .judge import STUDENT_META

    meta_file = folder / STUDENT_META
    if not meta_file.is_file():
        return {}
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    for key in PUBLISHED_META_KEYS:
        if meta.get(key):
            meta[key] = display_ref(meta[key])
    meta_file.write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return meta


def publish_folder(folder: Path, base: str, card: str) -> None:
    """Make `folder` fit to upload: the adapter config and stepgap_student.json name models as
    published (never a path of this machine), and README.md is `card`."""
    config = folder / "adapter_config.json"
    if config.is_file():
        data = json.loads(config.read_text(encoding="utf-8"))
        data["base_model_name_or_path"] = display_ref(base)
        config.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
    publish_meta(folder)
    (folder / CARD).write_text(card, encoding="utf-8")


def publishing_trainer(trainer_cls: type, publish: Callable[[Any, Path], None]) -> type:
    """`trainer_cls` (TRL's SFTTrainer) whose README.md is our card and whose every Hub upload
    finds its folder made fit to publish by `publish(trainer, folder)`.

    Three writers of README.md meet in a training run, and the Trainer uploads what lies in the
    folder (all but `checkpoint-*` and `_*`):
    - TRL's `_save_checkpoint` calls `create_model_card` before every checkpoint, and
      `Trainer.push_to_hub` (which `save_model` calls when `push_to_hub` is set) calls it after
      saving and right before the final upload. Our card replaces TRL's draft rather than merging
      into it: the draft's quick start loads the adapter as a text-generation pipeline, which
      says nothing of the judge JSON, and it names a local base by its path.
    - peft's `save_pretrained` writes or updates README.md in every folder it saves (each
      `checkpoint-N/` and the output folder), with the base as loaded: a path of this machine.
      `create_model_card` runs after the final save, so ours is the last word there; a
      checkpoint folder is published in `_push_from_checkpoint`, before the Trainer copies its
      adapter files to the output folder and uploads (and, for the `checkpoint` strategies,
      uploads the checkpoint folder itself).
    """

    class PublishingTrainer(trainer_cls):  # type: ignore[misc, valid-type]
        def create_model_card(self, *args: Any, **kwargs: Any) -> None:
            if self.is_world_process_zero():
                publish(self, Path(self.args.output_dir))

        def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
            if self.is_world_process_zero() and self.args.hub_strategy != "end":
                publish(self, Path(checkpoint_folder))
            super()._push_from_checkpoint(checkpoint_folder)

    PublishingTrainer.__name__ = PublishingTrainer.__qualname__ = (
        f"Publishing{trainer_cls.__name__}"
    )
    return PublishingTrainer
