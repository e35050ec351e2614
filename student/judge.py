"""`student:PATH`: the distilled student as the judge of stages A-C.

PATH is a LoRA adapter folder (its base is read from `adapter_config.json`, or given with
`student_base`) or a merged model folder. The student writes the judge JSON plus the path and label it
learned from the teacher (`pipeline_path`, `gap_type`); decoding is held to that extended schema,
the extra keys go to `JudgeResult.extra` (hard-negative mining compares them with the teacher's)
and the judge object alone is fed to the same decision tree as the teacher's. A student trained
on the compact target (`sft-data --target compact`, recorded in its `stepgap_student.json`)
writes the judge's decisions and quote without reasoning strings; its answers are parsed into the
same judge object with empty reasoning.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from stepgap.data_builders.student_target import (
    check_target,
    parse_student_answer,
    student_json_schema,
)
from stepgap.models import (
    explain_load_errors,
    load_causal_lm,
    load_chat_tokenizer,
    looks_like_hub_id,
    merged_folder,
    model_identity,
)
from stepgap.schema import Judge
from stepgap.student.tiny import TINY_BASE, TINY_REF
from stepgap.teacher.judges import register_judge
from stepgap.teacher.judges.base import JudgeConfigError
from stepgap.teacher.judges.hf import HFJudge, StudentJudgeOptions
from stepgap.teacher.judges.openai_api import OpenAIJudge, OpenAIJudgeOptions

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
STUDENT_META = "stepgap_student.json"  # written by the trainer: how to prompt this student
TRAIN_TRACES = "train_trace_ids"  # its key for the traces the student saw


def meta_target(meta: dict[str, Any], where: str) -> str:
    """The target a student writes, from its metadata (`full` when it predates targets)."""
    return check_target(meta.get("target") or "full", f"{where}: target")


def is_adapter(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def load_student(
    path: str,
    base: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    base_revision: str | None = None,
) -> tuple[Any, Any]:
    """(tokenizer, model): an adapter merged into its base for fast generation, or a merged model.

    `base` overrides the base named in adapter_config.json; `base_revision` pins a hub base."""
    if not is_adapter(path):
        return load_causal_lm(path, device, dtype)
    from peft import PeftModel

    base = adapter_base(path, base)
    tokenizer, model = load_causal_lm(base, device, dtype, revision=base_revision)
    if (Path(path) / "tokenizer_config.json").is_file():  # the trained chat template wins
        tokenizer = load_chat_tokenizer(path)
    with explain_load_errors(path, "adapter"):
        model = PeftModel.from_pretrained(model, path).merge_and_unload()
    model.eval()
    return tokenizer, model


def adapter_base(path: str | Path, base: str | None = None) -> str:
    """The base model of an adapter: `base` when given, else the one its config names, found
    from any working folder (see `locate_base`)."""
    if base:
        return base
    config = json.loads((Path(path) / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    recorded = config.get("base_model_name_or_path")
    if not recorded:
        raise ValueError(
            f"{path}/{ADAPTER_CONFIG} names no base model; give its base (student_base, --student-base)"
        )
    return locate_base(path, recorded)


def locate_base(path: str | Path, recorded: str) -> str:
    """Where the base an adapter's config names (`recorded`) is from here.

    A hub id, a `pypi:` name or an existing path is itself. A relative path that is not here
    (adapters trained before their bases were recorded absolute name one relative to the
    folder training ran in) is looked for under the adapter's folder and each folder above it.
    A relative `owner/name` found nowhere is a hub id, unless it is the folder a tiny student's
    training built its base in; any other path found nowhere is an error saying how to give
    the base."""
    if recorded.startswith("pypi:") or os.path.exists(recorded):
        return recorded
    if not os.path.isabs(recorded):
        folder = Path(os.path.abspath(path))
        for above in (folder, *folder.parents):
            if (above / recorded).exists():
                log.info("%s: its base %s is %s", path, recorded, above / recorded)
                return str(above / recorded)
        if looks_like_hub_id(recorded) and not _tiny_base(path, recorded):
            return recorded
    where = "" if os.path.isabs(recorded) else " from here, in the adapter's folder or above it"
    raise FileNotFoundError(
        f"{path}/{ADAPTER_CONFIG} names its base {recorded}, which is not found{where}: give the "
        "base (--student-base PATH; --base for stepgap export), or write its path or hub id "
        f"into {ADAPTER_CONFIG} as base_model_name_or_path"
    )


def _tiny_base(path: str | Path, recorded: str) -> bool:
    """Whether `recorded` is the folder a tiny student's training built its base in."""
    return Path(recorded).name == TINY_BASE and student_meta(path).get("base_model") == TINY_REF


class StudentJudge(HFJudge):
    """`student:PATH`: a trained student as a local judge (`HFJudge`), loaded from its adapter
    (on `options.student_base`, else the base its adapter names, at `base_revision`) or its
    merged folder, prompted and parsed as it was trained."""

    name = "student"
    target = "full"  # what it was trained to write; set from its stepgap_student.json
    options_class = StudentJudgeOptions

    def __init__(
        self,
        model: str,
        options: StudentJudgeOptions | None = None,
        *,
        base_revision: str | None = None,
        **services: Any,
    ) -> None:
        options = options or StudentJudgeOptions()
        self.base = options.student_base
        self.base_revision = base_revision
        meta = student_meta(model)
        self.nli_features = bool(meta.get("nli_features", False))  # the Checker adds them
        self.earlier_evidence_chars = meta.get("earlier_evidence_chars")  # its prompt budget
        self.target = meta_target(meta, str(Path(model) / STUDENT_META))  # what it writes
        super().__init__(model, options, **services)  # builds the decoding index from schema()

    def load(self, model: str, device: str | None, dtype: str | None) -> tuple[Any, Any]:
        return load_student(model, self.base, device, dtype, self.base_revision)

    def vllm_folder(self, model: str, dtype: str | None) -> tuple[str, str | None]:
        """An adapter is merged into its base once, into a folder vLLM loads."""
        if not is_adapter(model):
            return super().vllm_folder(model, dtype)
        base = adapter_base(model, self.base)
        revision = f"@{self.base_revision}" if self.base_revision else ""
        identity = f"{model_identity(model)}-{model_identity(base)}{revision}-{dtype or 'float32'}"
        return str(
            merged_folder(
                f"student-{identity}",
                lambda: load_student(model, self.base, "cpu", dtype, self.base_revision),
            )
        ), None

    def schema(self) -> dict[str, Any]:
        return student_json_schema(self.target)

    def parse(self, text: str) -> tuple[Judge, dict[str, Any]]:
        return parse_student_answer(text, self.target)


class ServedStudentJudge(OpenAIJudge):
    """The student served by an OpenAI-compatible engine (vLLM, SGLang, llama.cpp's server)
    under `model`: asked with the student's schema (guided JSON), parsed as the student's
    answer. `nli_features`: the student was trained with NLI features in its prompt (the
    Checker adds them), as its bundle records; `earlier_evidence_chars`: its prompt's budget
    of earlier evidence, when it was trained with a shorter one than the teacher's; `target`:
    the answer it was trained to write (`full` or `compact`), the schema it is asked for."""

    name = "openai-student"
    target = "full"

    def __init__(
        self,
        model: str,
        options: OpenAIJudgeOptions | None = None,
        *,
        nli_features: bool = False,
        earlier_evidence_chars: int | None = None,
        target: str = "full",
        tokenizer: str | None = None,
        **services: Any,
    ) -> None:
        self.nli_features = nli_features
        self.earlier_evidence_chars = earlier_evidence_chars
        self.target = check_target(target)
        super().__init__(model, options, **services)
        # the student's own tokenizer (a bundle's `student/`, where it ships one): the first
        # answer's prompt tokens show whether the server tokenizes as the student was trained
        self.tokenizer = None
        if tokenizer:
            try:
                self.tokenizer = load_chat_tokenizer(tokenizer)
            except (OSError, ValueError) as exc:  # no chat template, say: nothing to check with
                log.warning("the served student's tokens are not checked: %s", exc)
        self.tokens_checked = self.tokenizer is None

    def answered(self, messages: list[dict[str, Any]], completion: Any) -> None:
        """The first answer's prompt tokens, as the server counted them, against the student's
        tokenizer: a server that tokenizes otherwise (another tokenizer or model, as vLLM
        rebuilding a compact vocabulary's tokenizer from the model's type) answers other
        prompts than the student was trained on, and its labels are not the student's."""
        served = completion.usage.get("prompt_tokens")
        if self.tokens_checked or not served:
            return
        self.tokens_checked = True
        text = self.tokenizer.apply_chat_template(  # type: ignore[union-attr]
            messages, tokenize=False, add_generation_prompt=True
        )
        local = len(self.tokenizer(text, add_special_tokens=False).input_ids)  # type: ignore[misc]
        if abs(served - local) > max(8, local // 20):
            raise JudgeConfigError(
                f"the server at {self.base_url or 'the OpenAI API'} counts {served} tokens in a "
                f"prompt that the student's tokenizer makes {local}: it does not tokenize as the "
                "student was trained to read, and its answers would not be the student's. Serve "
                "the bundle's own tokenizer (vLLM: --tokenizer ./student; SGLang: "
                "--tokenizer-path ./student), or the model the bundle holds"
            )

    @property
    def provenance(self) -> dict[str, str | None]:
        return {"spec": f"openai:{self.model}", "note": "the bundle's student, served remotely"}

    def schema(self) -> dict[str, Any]:
        return student_json_schema(self.target)

    def parse(self, text: str) -> tuple[Judge, dict[str, Any]]:
        return parse_student_answer(text, self.target)


def student_meta(path: str | Path) -> dict[str, Any]:
    """`stepgap_student.json` of a student folder (empty when absent)."""
    meta = Path(path) / STUDENT_META
    return json.loads(meta.read_text(encoding="utf-8")) if meta.is_file() else {}


# `student:PATH` beside the teacher's judges: a spec names it once `stepgap.student` is imported.
# Its options class lives beside the local judge's (teacher/judges/hf.py), where the checker's
# configuration finds it for the flags; its page is docs/judges/student.md.
register_judge("student", StudentJudge)
