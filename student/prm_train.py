"""Train the typed PRM (`student/prm.py`) on teacher verdicts: what a recipe with `kind: prm`
runs (`student/train.py`, `stepgap train`).

The data are whole traces, rebuilt from the verdicts' questions and steps and split by trace
with the rule `stepgap sft-data` uses (`in_eval_split`, the recipe's `eval_fraction` and
`seed`), so a PRM and a generative student trained on the same verdicts hold out the same
traces. Each trace is read once as the PRM reads it (`PRMEncoder`), with the teacher's label
and firing stage as targets at each step's marker and nothing trained anywhere else. The loss
is the sum of the two heads' cross-entropies. The model is fine-tuned whole by transformers'
`Trainer` under the recipe's `SFTConfig` (a `TrainingArguments`), and written with its
tokenizer, its `PRMFormat` (`stepgap_prm.json`, with the training traces) and a model card:
the folder `PRMChecker.from_folder` loads.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepgap.data_builders.sft_data import in_eval_split
from stepgap.schema import LABELS, Trace, Verdict

from .prm import (
    COLUMNS,
    IGNORE,
    TINY_PRM_REF,
    PRMEncoder,
    PRMFormat,
    head_config,
    is_prm,
    prm_meta,
    step_targets,
    step_text,
)
from .recipe import Recipe

log = logging.getLogger(__name__)

TINY_PRM_BASE = "tiny-prm-base"  # under output_dir: the tiny PRM base built from the data


def read_verdicts(path: str | Path) -> list[Verdict]:
    """Teacher verdicts from a JSONL file, or from every `*.jsonl` of a folder (in name order);
    bad records are skipped with one warning naming each file and line."""
    from stepgap.io import ErrorReport, read_models

    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if not files:
            raise FileNotFoundError(f"dataset {path}: a folder without verdicts (*.jsonl)")
    elif path.is_file():
        files = [path]
    else:
        raise FileNotFoundError(f"dataset not found: {path} (a verdicts JSONL or a folder of them)")
    report = ErrorReport()
    verdicts = [v for f in files for _, v in read_models(f, Verdict, report)]
    if report:
        log.warning("%s: skipped %d bad record(s):\n%s", path, len(report), report.summary())
    return verdicts


@dataclass
class PRMData:
    """Traces split by trace, and the teacher's verdict of each (trace, step)."""

    train: list[Trace]
    held_out: list[Trace]
    teacher: dict[tuple[str, int], Verdict]

    @classmethod
    def of(cls, verdicts: Sequence[Verdict], eval_fraction: float, seed: int) -> PRMData:
        from .mining import pool_traces

        traces = pool_traces(verdicts)
        train = [t for t in traces if not in_eval_split(t.id, eval_fraction, seed)]
        held = [t for t in traces if in_eval_split(t.id, eval_fraction, seed)]
        teacher = {(v.trace_id, v.step): v for v in verdicts}
        return cls(train, held, teacher)

    def labelled(self, traces: Sequence[Trace]) -> int:
        return sum(self.targets(t.id, s.index)[0] != IGNORE for t in traces for s in t.steps or [])

    def targets(self, trace_id: str, step: int) -> tuple[int, int]:
        verdict = self.teacher.get((trace_id, step))
        return step_targets(verdict) if verdict is not None else (IGNORE, IGNORE)

    def texts(self) -> list[str]:
        """What the tiny base's vocabulary is trained on: the training traces as the PRM reads
        them."""
        return [t.question for t in self.train] + [
            " ".join(step_text(s)) for t in self.train for s in t.steps or []
        ]


def encode_split(
    encoder: PRMEncoder, data: PRMData, traces: Sequence[Trace]
) -> tuple[list[dict[str, Any]], int]:
    """(one example a trace, labelled steps whose marker fell past the window): `labels` and
    `stage_labels` are the teacher's columns at each step's marker, IGNORE elsewhere."""
    examples, past = [], 0
    for trace in traces:
        encoded = encoder.encode(trace)
        labels = [IGNORE] * len(encoded.input_ids)
        stages = list(labels)
        for step, position in zip(trace.steps or [], encoded.markers, strict=True):
            label, stage = data.targets(trace.id, step.index)
            if label == IGNORE and stage == IGNORE:
                continue
            if position is None:
                past += 1
                continue
            labels[position], stages[position] = label, stage
        if any(x != IGNORE for x in labels + stages):
            examples.append(
                {"input_ids": encoded.input_ids, "labels": labels, "stage_labels": stages}
            )
    return examples, past


class PRMCollator:
    """Right-pads a batch: input_ids with the pad id, attention_mask with 0, targets with
    IGNORE."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, Any]:
        import torch

        width = max(len(f["input_ids"]) for f in features)

        def pad(key: str, value: int) -> Any:
            rows = [f[key] + [value] * (width - len(f[key])) for f in features]
            return torch.tensor(rows, dtype=torch.long)

        mask = [[1] * len(f["input_ids"]) + [0] * (width - len(f["input_ids"])) for f in features]
        return {
            "input_ids": pad("input_ids", self.pad_id),
            "attention_mask": torch.tensor(mask, dtype=torch.long),
            "labels": pad("labels", IGNORE),
            "stage_labels": pad("stage_labels", IGNORE),
        }


def prm_loss(logits: Any, labels: Any, stage_labels: Any) -> Any:
    """The label head's cross-entropy (columns :len(LABELS)) plus the stage head's (the rest),
    each over the markers that have a target."""
    import torch.nn.functional as F

    def head(columns: Any, targets: Any) -> Any:
        keep = targets != IGNORE
        if not keep.any():  # a batch of failed or older-tree verdicts only: no signal, no NaN
            return columns.sum() * 0.0
        return F.cross_entropy(columns[keep].float(), targets[keep])

    n = len(LABELS)
    return head(logits[..., :n], labels) + head(logits[..., n:], stage_labels)


def prm_trainer_class() -> type:
    """transformers' Trainer with the PRM's loss (imported only when a PRM trains)."""
    from transformers import Trainer

    class PRMTrainer(Trainer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.model_accepts_loss_kwargs = False  # the loss is a batch mean: scale for GA

        def compute_loss(
            self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, **_: Any
        ) -> Any:
            labels, stages = inputs.pop("labels"), inputs.pop("stage_labels")
            outputs = model(**inputs)
            loss = prm_loss(outputs.logits, labels, stages)
            return (loss, outputs) if return_outputs else loss

    return PRMTrainer


def marker_argmax(logits: Any, labels: Any) -> Any:
    """Each position's label and stage column (what evaluation keeps instead of the logits)."""
    import torch

    n = len(LABELS)
    return torch.stack([logits[..., :n].argmax(-1), logits[..., n:].argmax(-1)], dim=-1)


def head_accuracy(prediction: Any) -> dict[str, float]:
    """Accuracy of the label head and of the stage head at the held-out markers."""
    import numpy as np

    predicted = prediction.predictions
    labels, stages = prediction.label_ids
    out = {}
    for name, column, target in (("label", 0, labels), ("stage", 1, stages)):
        keep = target != IGNORE
        hits = predicted[..., column][keep] == target[keep]
        out[f"{name}_accuracy"] = float(np.mean(hits)) if keep.any() else float("nan")
    return out


def base_ref(recipe: Recipe) -> str:
    """The base as a reference that loads from any folder (the tiny base: the folder it is
    built in; a local folder: absolute; a hub id as given)."""
    base = recipe.model_args.model_name_or_path
    if base == TINY_PRM_REF:
        return os.path.abspath(Path(recipe.training_args.output_dir) / TINY_PRM_BASE)
    return os.path.abspath(base) if os.path.exists(base) else base


def load_prm_base(recipe: Recipe, data: PRMData) -> tuple[Any, Any]:
    """(model, tokenizer): a token classifier with the PRM's two heads. `tiny-random:deberta-v2`
    is built from the training texts under `output_dir/tiny-prm-base`; any other base gets a
    fresh classifier of `COLUMNS` columns (a PRM folder keeps its own, to continue it)."""
    from transformers import AutoModelForTokenClassification

    from stepgap.models import explain_load_errors, load_tokenizer, resolve_model_ref

    from .launch import process_state
    from .prm import tiny_prm_base

    model_args = recipe.model_args
    if model_args.model_name_or_path == TINY_PRM_REF:
        with process_state().main_process_first():  # built once, read by the other ranks
            ref = str(tiny_prm_base(base_ref(recipe), data.texts(), recipe.training_args.seed))
    else:
        ref = resolve_model_ref(model_args.model_name_or_path)
    kwargs: dict[str, Any] = {}
    if model_args.model_revision != "main":
        kwargs["revision"] = model_args.model_revision
    if model_args.attn_implementation:
        kwargs["attn_implementation"] = model_args.attn_implementation
    with explain_load_errors(ref, "tokenizer"):
        tokenizer = load_tokenizer(ref, **kwargs)
    with explain_load_errors(ref, "PRM base"):
        model = AutoModelForTokenClassification.from_pretrained(
            ref, **head_config(), ignore_mismatched_sizes=True, dtype=prm_dtype(recipe),
            **kwargs,
        )  # fmt: skip
    if tokenizer.pad_token is None:  # a decoder base
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def prm_dtype(recipe: Recipe) -> Any:
    """The weights' dtype: fp32 for `auto` (the master weights; bf16 mixed precision follows the
    GPU, see `recipe._bf16_default`), else the recipe's."""
    import torch

    dtype = recipe.model_args.dtype
    return torch.float32 if dtype in (None, "auto") else getattr(torch, dtype)


def prm_format(recipe: Recipe) -> PRMFormat:
    """How the PRM reads a trace: the recipe's window (`max_length`) and reading keys."""
    script = recipe.script_args
    return PRMFormat(
        max_length=recipe.training_args.max_length,
        evidence_tokens=script.prm_evidence_tokens,
        question_tokens=script.prm_question_tokens,
    )


def train_prm(recipe: Recipe, *, resume: bool = False) -> dict[str, Any]:
    """Train the PRM on the recipe and write its folder to `output_dir`; returns the metrics
    (global_step, the Trainer's, eval loss and the heads' held-out accuracy)."""
    script, args = recipe.script_args, recipe.training_args
    data = PRMData.of(read_verdicts(script.dataset), script.eval_fraction, args.seed)
    if not data.labelled(data.train):
        raise ValueError(f"{script.dataset}: no labelled steps of training traces to learn from")
    model, tokenizer = load_prm_base(recipe, data)
    fmt = prm_format(recipe)
    encoder = PRMEncoder(tokenizer, fmt)
    train_set, past = encode_split(encoder, data, data.train)
    if script.max_train_examples is not None:
        train_set = train_set[: script.max_train_examples]
    eval_set, past_eval = encode_split(encoder, data, data.held_out)
    if past or past_eval:
        log.warning(
            "%d training and %d held-out labelled steps fall past the PRM's window "
            "(max_length=%d): not trained or measured; raise max_length or lower "
            "prm_evidence_tokens",
            past, past_eval, fmt.max_length,
        )  # fmt: skip
    trainer = prm_trainer(recipe, model, tokenizer, encoder.pad_id, train_set, eval_set)
    metrics = fit(trainer, args, resume)
    metrics["prm_steps"] = {
        "train_traces": len(train_set), "train_steps": data.labelled(data.train),
        "held_out_traces": len(eval_set), "held_out_steps": data.labelled(data.held_out),
        "past_window": past + past_eval,
    }  # fmt: skip
    if eval_set:
        metrics.update(trainer.evaluate())
    trainer.save_model(args.output_dir)  # rank 0 writes; every rank takes part
    if trainer.is_world_process_zero():
        write_prm_folder(recipe, fmt, tokenizer, data, metrics)
    trainer.accelerator.wait_for_everyone()
    trainer.save_state()
    return metrics


def prm_trainer(
    recipe: Recipe,
    model: Any,
    tokenizer: Any,
    pad_id: int,
    train_set: list[dict[str, Any]],
    eval_set: list[dict[str, Any]],
) -> Any:
    """The PRM's Trainer on the recipe's arguments (evaluation off without held-out steps)."""
    from transformers.trainer_utils import IntervalStrategy

    args = recipe.training_args
    if not eval_set and args.eval_strategy != IntervalStrategy.NO:
        log.info("%s has no held-out labelled steps: no evaluation during training",
                 recipe.script_args.dataset)  # fmt: skip
        args.eval_strategy, args.do_eval = IntervalStrategy.NO, False
    args.label_names = ["labels", "stage_labels"]
    return prm_trainer_class()(
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=eval_set or None,
        processing_class=tokenizer,
        data_collator=PRMCollator(pad_id),
        compute_metrics=head_accuracy,
        preprocess_logits_for_metrics=marker_argmax,
    )


def fit(trainer: Any, args: Any, resume: bool) -> dict[str, Any]:
    """Train, from `output_dir`'s last checkpoint with `resume`; the Trainer's metrics."""
    from .launch import accept_indexed_cpu_locations, last_checkpoint

    checkpoint = last_checkpoint(args.output_dir) if resume else None
    if checkpoint and args.world_size > 1 and args.device.type == "cpu":
        accept_indexed_cpu_locations()
    if resume and checkpoint is None:
        log.warning("--resume: no checkpoint in %s; starting from scratch", args.output_dir)
    result = trainer.train(resume_from_checkpoint=checkpoint)
    return {**result.metrics, "global_step": trainer.state.global_step, "resumed_from": checkpoint}


def trained_traces(recipe: Recipe, data: PRMData) -> list[str]:
    """The traces this PRM was trained on, with those of the PRM it continued (when its base is
    a PRM folder), so that mining and evaluation keep to held-out traces."""
    from .judge import TRAIN_TRACES

    ids = {t.id for t in data.train}
    base = recipe.model_args.model_name_or_path
    if is_prm(base):
        ids |= set(prm_meta(base).get(TRAIN_TRACES) or [])
    return sorted(ids)


def write_prm_folder(
    recipe: Recipe, fmt: PRMFormat, tokenizer: Any, data: PRMData, metrics: dict[str, Any]
) -> None:
    """Beside the weights: the tokenizer, `stepgap_prm.json` and README.md."""
    from stepgap.teacher.prompt import PROMPT_VERSION

    from .judge import TRAIN_TRACES

    out = Path(recipe.training_args.output_dir)
    tokenizer.save_pretrained(out)
    extra = {TRAIN_TRACES: trained_traces(recipe, data), "base_model": base_ref(recipe)}
    fmt.write(out, prompt_version=PROMPT_VERSION, **extra)
    (out / "README.md").write_text(render_prm_card(recipe, fmt, metrics), encoding="utf-8")


CARD_METRICS = ("train_loss", "eval_loss", "eval_label_accuracy", "eval_stage_accuracy")
CARD_RECIPE = ("learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
               "gradient_accumulation_steps", "weight_decay", "dtype", "seed")  # fmt: skip


def render_prm_card(recipe: Recipe, fmt: PRMFormat, metrics: dict[str, Any]) -> str:
    """A short model card: what the PRM is, its base, how it reads a trace, the data and the
    metrics."""
    from stepgap.models import display_ref

    from .card import _stand_in, _table
    from .recipe import recipe_value

    base = display_ref(base_ref(recipe))
    note = _stand_in(base_ref(recipe))
    counts = metrics["prm_steps"]
    scores = {k: metrics[k] for k in CARD_METRICS if isinstance(metrics.get(k), float)}
    return "\n".join([
        "---", "library_name: transformers", "pipeline_tag: token-classification",
        "tags: [stepgap, prm, process-reward-model]", "---", "",
        "# stepgap typed PRM", "",
        f"A typed process reward model fine-tuned from `{base}`: it reads a segmented search "
        "trace once, with a marker token after each step, and predicts at each marker the "
        "step's label (no_gap, CC, IE, MB) and the stage of stepgap's decision tree that "
        "fired, distilled from the hybrid checker's verdicts. Load it with "
        "`stepgap.student.prm.PRMChecker.from_folder(FOLDER)`.",
        *([] if note is None else ["", f"> {note}: for tests, not for use."]),
        "", "## Reading", "", _table({
            "max_length": fmt.max_length, "evidence_tokens": fmt.evidence_tokens,
            "question_tokens": fmt.question_tokens, "columns": COLUMNS,
        }),
        "", "## Data", "", _table(counts),
        "", "## Training recipe", "", _table({k: recipe_value(recipe, k) for k in CARD_RECIPE}),
        "", "## Metrics", "", _table(scores | {"global_step": metrics["global_step"]}), "",
    ])  # fmt: skip
