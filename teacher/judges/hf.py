"""`hf:PATH_OR_ID`: a local causal LM as the judge (a distilled student, SmolLM2, any chat model).

The model answers with its own chat template, in batches. With `constrained=True` (the default)
decoding follows the judge JSON schema through an outlines-core finite-state index, so every
finished answer parses; an answer cut at `max_new_tokens` is reported as a failure, never
guessed. `max_string_chars` bounds the free-text fields (reasoning, quote) when a model rambles.
Stage confidences come from the constrained token probabilities of the decisive fields.
GGUF checkpoints load too (`hf:/path/model.Q4_1.gguf`, dequantized by transformers).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from stepgap.data_builders.schema import Judge
from stepgap.models import (
    align_chat_eos,
    display_ref,
    explain_load_errors,
    resolve_model_ref,
    stand_in_note,
)

from ..nli.hf import resolve_device, resolve_dtype
from ..prompt import PROMPT_VERSION
from .base import (
    JudgeParseError,
    JudgeRequest,
    JudgeResult,
    answer_json_schema,
    answer_params,
    judge_json_schema,
    parse_answer,
    parse_judge,
)
from .cache import JudgeCache, cache_key
from .confidence import stage_confidences
from .cost import CostMeter

log = logging.getLogger(__name__)


def judge_regex(max_string_chars: int | None = None, schema: dict[str, Any] | None = None) -> str:
    """A judge schema (default: the teacher's) as a compact-JSON regular expression."""
    from outlines_core.json_schema import build_regex_from_schema

    schema = schema if schema is not None else judge_json_schema()
    if max_string_chars is not None:
        for section in schema["properties"].values():
            for prop in section.get("properties", {}).values():
                if prop.get("type") == "string" and "enum" not in prop:
                    prop["maxLength"] = max_string_chars
    return build_regex_from_schema(json.dumps(schema), whitespace_pattern="")


def build_index(tokenizer: Any, regex: str) -> Any:
    """An outlines-core index of `regex` over the tokenizer's vocabulary (special tokens out)."""
    from outlines_core import Index, Vocabulary

    special = set(tokenizer.all_special_ids)
    tokens: dict[str, list[int]] = {}
    for token, tid in tokenizer.get_vocab().items():
        if tid in special:
            continue
        text = tokenizer.convert_tokens_to_string([token])
        if text:
            tokens.setdefault(text, []).append(tid)
    return Index(regex, Vocabulary(tokenizer.eos_token_id, tokens))


class SchemaConstraint:
    """A `generate` logits processor that keeps every row on the index's automaton."""

    def __init__(self, index: Any, eos_token_id: int) -> None:
        self.index = index
        self.eos = eos_token_id
        self.guides: list[Any] | None = None
        self.done: list[bool] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch
        from outlines_core import Guide

        batch, vocab = scores.shape
        if self.guides is None:
            self.guides = [Guide(self.index) for _ in range(batch)]
            self.done = [False] * batch
        else:
            for i, guide in enumerate(self.guides):
                last = int(input_ids[i, -1])
                if self.done[i] or last == self.eos:
                    self.done[i] = True
                else:
                    guide.advance(last, return_tokens=False)
        words = (vocab + 31) // 32
        bits = torch.zeros((batch, words), dtype=torch.int32)
        for i, guide in enumerate(self.guides):
            if not self.done[i]:
                guide.write_mask_into(bits[i].data_ptr(), words, 4)
        shifts = torch.arange(32, dtype=torch.int32)
        allowed = ((bits.unsqueeze(-1) >> shifts) & 1).bool().view(batch, -1)[:, :vocab]
        for i in range(batch):
            if self.done[i]:
                allowed[i, self.eos] = True
        return scores.masked_fill(~allowed.to(scores.device), float("-inf"))


def load_causal_lm(
    ref: str, device: str | None = None, dtype: str | None = None, revision: str | None = None
):
    """(tokenizer, model) from a hub id (at `revision`), a local folder or a `.gguf` file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = resolve_model_ref(ref)
    kwargs: dict[str, Any] = {"revision": revision} if revision else {}
    source = ref
    if ref.endswith(".gguf"):
        source, kwargs["gguf_file"] = str(Path(ref).parent), Path(ref).name
    device = resolve_device(device)
    with explain_load_errors(ref, "tokenizer"):
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    with explain_load_errors(ref, "model"):
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=resolve_dtype(dtype, device) or torch.float32, **kwargs
        ).to(device)
    model.eval()
    if tokenizer.chat_template is None:
        raise ValueError(f"{ref}: the tokenizer has no chat template; the judge needs one")
    align_chat_eos(tokenizer)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer, model


class HFJudge:
    """Batched greedy generation of judge objects; subclasses change how the model loads, the
    schema it is held to and how an answer is parsed (see `stepgap.student.judge`)."""

    name = "hf"

    def __init__(
        self,
        model: str,
        *,
        device: str | None = None,
        dtype: str | None = None,
        batch_size: int = 8,
        max_new_tokens: int = 768,
        constrained: bool = True,
        max_string_chars: int | None = None,
        cache: JudgeCache | None = None,
        meter: CostMeter | None = None,
        on_result: Callable[[JudgeRequest, JudgeResult], None] | None = None,
    ) -> None:
        self.model_ref = model
        self.tokenizer, self.model = self.load(model, device, dtype)
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.constrained = constrained
        self.max_string_chars = max_string_chars
        self.index = (
            build_index(self.tokenizer, judge_regex(max_string_chars, self.schema()))
            if constrained
            else None
        )
        self.answer_indexes: dict[type, Any] = {}  # per answer schema of JudgeRequest.answer
        self.cache = cache
        self.meter = meter or CostMeter(model=model)
        self.on_result = on_result
        self.params = {
            "max_new_tokens": max_new_tokens,
            "constrained": constrained,
            "max_string_chars": max_string_chars,
        }

    def load(self, model: str, device: str | None, dtype: str | None) -> tuple[Any, Any]:
        return load_causal_lm(model, device, dtype)

    @property
    def provenance(self) -> dict[str, str | None]:
        """What a verdict says about the judge that decided it (no local paths)."""
        return {
            "spec": f"{self.name}:{display_ref(self.model_ref)}",
            "note": stand_in_note(self.model.config),
        }

    def schema(self) -> dict[str, Any]:
        """The JSON schema that constrained decoding follows."""
        return judge_json_schema()

    def parse(self, text: str) -> tuple[Judge, dict[str, Any]]:
        """(judge object, anything the answer holds beyond it)."""
        return parse_judge(text), {}

    def answer_index(self, answer: type | None) -> Any:
        """The decoding constraint of a request: this judge's schema, or the request's own."""
        if not self.constrained:
            return None
        if answer is None:
            return self.index
        if answer not in self.answer_indexes:
            regex = judge_regex(self.max_string_chars, answer_json_schema(answer))
            self.answer_indexes[answer] = build_index(self.tokenizer, regex)
        return self.answer_indexes[answer]

    def judge(self, requests: Sequence[JudgeRequest]) -> list[JudgeResult]:
        results: list[JudgeResult | None] = [None] * len(requests)
        keys = [
            cache_key(
                self.name, self.model_ref, PROMPT_VERSION, {**self.params, **answer_params(r)}, r
            )
            for r in requests
        ]
        todo = []
        for i, (request, key) in enumerate(zip(requests, keys, strict=True)):
            hit = self.cache.get(key, request.answer) if self.cache is not None else None
            if hit is not None:
                self.meter.hit()
                results[i] = JudgeResult(judge=hit.judge, confidences=hit.confidences)
                self._report(request, results[i])
            else:
                todo.append(i)
        prompts = {
            i: self.tokenizer.apply_chat_template(
                requests[i].messages, add_generation_prompt=True, tokenize=False
            )
            for i in todo
        }
        # one answer schema per batch (one constraint); similar lengths share a batch
        groups: dict[Any, list[int]] = {}
        for i in todo:
            groups.setdefault(requests[i].answer, []).append(i)
        batches = []
        for answer, group in groups.items():
            group.sort(key=lambda i: len(prompts[i]))
            for start in range(0, len(group), self.batch_size):
                batches.append((answer, group[start : start + self.batch_size]))
        bar = tqdm(total=len(todo), desc=f"{self.name} judge", unit="step", disable=None)
        for answer, batch in batches:
            bar.update(len(batch))
            generated = self._generate([prompts[i] for i in batch], answer)
            for i, result in zip(batch, generated, strict=True):
                if result.judge is not None and self.cache is not None:
                    self.cache.put(keys[i], self.model_ref, result)
                if result.judge is None:
                    self.meter.failed()
                results[i] = result
                self._report(requests[i], result)
        bar.close()
        return results  # type: ignore[return-value]

    def _report(self, request: JudgeRequest, result: JudgeResult) -> None:
        if self.on_result is not None:
            self.on_result(request, result)

    def _generate(self, prompts: list[str], answer: type | None = None) -> list[JudgeResult]:
        import torch
        from transformers import LogitsProcessorList

        enc = self.tokenizer(
            prompts,
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
            return_token_type_ids=False,
        ).to(self.model.device)
        eos = self.tokenizer.eos_token_id
        processors = LogitsProcessorList()
        index = self.answer_index(answer)
        if index is not None:
            processors.append(SchemaConstraint(index, eos))
        with torch.inference_mode():
            out = self.model.generate(
                **enc,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                logits_processor=processors,
                output_scores=True,
                return_dict_in_generate=True,
                eos_token_id=eos,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        new = out.sequences[:, enc["input_ids"].shape[1] :]
        logprobs = torch.stack(out.scores, dim=1).float().log_softmax(-1)  # (batch, steps, vocab)
        results = []
        for row in range(new.shape[0]):
            ids = new[row].tolist()
            n = ids.index(eos) if eos in ids else len(ids)
            usage = {
                "prompt_tokens": int(enc["attention_mask"][row].sum()),
                "completion_tokens": min(n + 1, len(ids)),
            }
            self.meter.add(usage)
            if n == len(ids):
                results.append(
                    JudgeResult.failed(
                        f"the answer was truncated at max_new_tokens={self.max_new_tokens}", usage
                    )
                )
                continue
            text = self.tokenizer.decode(ids[:n], skip_special_tokens=True)
            try:
                judge, extra = (
                    self.parse(text) if answer is None else (parse_answer(text, answer), {})
                )
            except JudgeParseError as exc:
                results.append(JudgeResult.failed(str(exc), usage))
                continue
            tokens = [
                (self.tokenizer.decode([t]), float(logprobs[row, k, t]))
                for k, t in enumerate(ids[:n])
            ]
            conf = {s: p for s, p in stage_confidences(tokens).items() if math.isfinite(p)}
            conf = conf if answer is None else {}  # stage fields of the judge schema only
            results.append(JudgeResult(judge=judge, confidences=conf, usage=usage, extra=extra))
        return results


def load_hf_judge(model: str, **options: Any) -> HFJudge:
    known = {
        "device", "dtype", "batch_size", "max_new_tokens", "constrained", "max_string_chars",
        "cache", "meter", "on_result",
    }  # fmt: skip
    return HFJudge(model, **{k: v for k, v in options.items() if k in known and v is not None})
