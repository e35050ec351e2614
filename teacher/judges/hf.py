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
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from stepgap.models import (
    align_chat_eos,
    display_ref,
    explain_load_errors,
    model_identity,
    pretrained_source,
    quiet_gguf_load,
    resolve_model_ref,
    stand_in_note,
)
from stepgap.schema import Judge

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


class TokenMasks:
    """The allowed tokens of an index's states, each state's mask built once on the model's
    device (not a full-vocabulary mask per row per token on the CPU)."""

    def __init__(self, index: Any, vocab: int, eos: int, device: Any) -> None:
        self.index, self.vocab, self.eos, self.device = index, vocab, eos, device
        self._tokens: dict[int, list[int]] = {}
        self._masks: dict[int, Any] = {}

    def initial(self) -> int:
        return self.index.get_initial_state()

    def tokens(self, state: int) -> list[int]:
        if state not in self._tokens:
            self._tokens[state] = sorted(self.index.get_allowed_tokens(state))
        return self._tokens[state]

    def mask(self, state: int) -> Any:
        """Boolean (vocab,) tensor: True where a token is allowed in `state`."""
        if state not in self._masks:
            import torch

            mask = torch.zeros(self.vocab, dtype=torch.bool)
            mask[[t for t in self.tokens(state) if t < self.vocab]] = True
            self._masks[state] = mask.to(self.device)
        return self._masks[state]

    def advance(self, state: int, token: int) -> int:
        nxt = self.index.get_next_state(state, token)
        if nxt is None:
            raise RuntimeError(f"token {token} is not allowed in state {state} of the schema")
        return nxt


class SchemaConstraint:
    """A `generate` logits processor that keeps every row on its index's automaton (the plain
    path, `HFJudge(fast=False)`). It keeps the chosen tokens' log-probabilities under the
    constraint itself (`logprobs`, completed by `finish`), so `generate` need not return the
    batch x steps x vocab scores."""

    def __init__(self, masks: Sequence[TokenMasks | None], eos_token_id: int) -> None:
        self.masks = list(masks)  # one per row; None: that row is unconstrained
        self.eos = eos_token_id
        self.states: list[int | None] = []
        self.done: list[bool] = []
        self.logprobs: list[list[float]] = [[] for _ in masks]
        self._last: Any = None  # the previous step's log-softmax of the processed scores

    def _record(self, chosen: Any) -> None:
        picked = self._last.gather(1, chosen.view(-1, 1).to(self._last.device)).view(-1)
        for i, lp in enumerate(picked.tolist()):
            self.logprobs[i].append(lp)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        batch, _ = scores.shape
        if self._last is None:
            self.states = [m.initial() if m is not None else None for m in self.masks]
            self.done = [False] * batch
        else:
            self._record(input_ids[:, -1])
            for i, m in enumerate(self.masks):
                last = int(input_ids[i, -1])
                if self.done[i] or last == self.eos:
                    self.done[i] = True
                elif m is not None:
                    self.states[i] = m.advance(self.states[i], last)  # type: ignore[arg-type]
        if any(m is not None for m in self.masks):
            import torch

            eos_only = torch.zeros(scores.shape[1], dtype=torch.bool, device=scores.device)
            eos_only[self.eos] = True
            rows = [
                eos_only
                if self.done[i]
                else (m.mask(self.states[i]) if m is not None else ~eos_only | eos_only)
                for i, m in enumerate(self.masks)
            ]
            scores = scores.masked_fill(~torch.stack(rows).to(scores.device), float("-inf"))
        self._last = scores.float().log_softmax(-1)
        return scores

    def finish(self, new_tokens: Any) -> list[list[float]]:
        """Log-probabilities of every generated token, row by row (`new_tokens`: batch x steps)."""
        if self._last is not None and new_tokens.shape[1] > len(self.logprobs[0]):
            self._record(new_tokens[:, -1])
        return self.logprobs


def load_causal_lm(
    ref: str, device: str | None = None, dtype: str | None = None, revision: str | None = None
):
    """(tokenizer, model) from a hub id (at `revision`), a local folder or a `.gguf` file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = resolve_model_ref(ref)
    source, kwargs = pretrained_source(ref)
    if revision:
        kwargs["revision"] = revision
    device = resolve_device(device)
    with quiet_gguf_load(ref) as tokenizer_kwargs:
        with explain_load_errors(ref, "tokenizer"):
            tokenizer = AutoTokenizer.from_pretrained(source, **kwargs, **tokenizer_kwargs)
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


def auto_batch_size(model: Any, tokens_per_row: int, cap: int = 64) -> int:
    """Rows per generation batch that fit a memory budget: a quarter of the free memory of the
    model's device (GPU) or of the machine (CPU) for the KV cache and its per-layer copies."""
    import torch

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else None
    config = config or model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    width = next(model.parameters()).element_size()
    # the cache (K and V, all layers) plus one layer's K and V repeated to every query head
    per_token = 2 * head_dim * width * (config.num_hidden_layers * kv_heads + heads)
    if model.device.type == "cuda":
        free = torch.cuda.mem_get_info(model.device)[0]
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    rows = int(free // 4 // max(1, per_token * tokens_per_row))
    return max(1, min(cap, rows))


MIN_SHARED_PREFIX = 16  # tokens a batch must share before its prefix is computed once


def shared_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every prompt of a batch has in common, leaving each at least one
    token of its own (the forward pass that gives the first answer token needs one)."""
    if len(prompts) < 2:
        return 0
    first, limit = prompts[0], min(len(p) for p in prompts) - 1
    for i in range(limit):
        token = first[i]
        if any(p[i] != token for p in prompts[1:]):
            return i
    return max(0, limit)


@dataclass
class Decoded:
    """One row's generated tokens and their log-probabilities under the constraint."""

    tokens: list[int]
    logprobs: list[float]
    forward_passes: int = 0  # the model calls that produced this row's tokens


class HFJudge:
    """Batched greedy generation of judge objects; subclasses change how the model loads, the
    schema it is held to and how an answer is parsed (see `stepgap.student.judge`).

    All pending requests are sorted by prompt length and cut into batches (results come back in
    request order). `batch_size=None` picks the batch by memory (`auto_batch_size`). The fast
    decoder (`fast=True`) is a greedy loop over the KV cache that drops finished rows and, when
    the schema allows exactly one token, appends it (and the run of such tokens after it) in the
    next forward pass instead of spending a pass on each; its tokens equal plain `generate`
    with the same constraint up to floating-point ties (`fast=False` is that plain path). With
    `share_prefix`, the tokens all prompts of a batch begin with (the chat template and the
    system prompt; batches are formed per system prompt) are run once and their KV cache is
    copied to every row, instead of once per row."""

    name = "hf"

    def __init__(
        self,
        model: str,
        *,
        device: str | None = None,
        dtype: str | None = None,
        batch_size: int | None = None,
        max_new_tokens: int = 768,
        constrained: bool = True,
        max_string_chars: int | None = None,
        fast: bool = True,
        share_prefix: bool = True,
        cache: JudgeCache | None = None,
        meter: CostMeter | None = None,
        on_result: Callable[[JudgeRequest, JudgeResult], None] | None = None,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.model_ref = model
        self.tokenizer, self.model = self.load(model, device, dtype)
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.constrained = constrained
        self.max_string_chars = max_string_chars
        self.fast = fast
        self.share_prefix = share_prefix
        self.index = (
            build_index(self.tokenizer, judge_regex(max_string_chars, self.schema()))
            if constrained
            else None
        )
        self.answer_indexes: dict[type, Any] = {}  # per answer schema of JudgeRequest.answer
        self.token_masks: dict[int, TokenMasks] = {}  # id(index) -> its states' masks
        self.cache = cache
        self.meter = meter or CostMeter(model=model)
        self.on_result = on_result
        self.params = {
            "max_new_tokens": max_new_tokens,
            "constrained": constrained,
            "max_string_chars": max_string_chars,
            # the cache keys answers by the model's content, not its name: a retrained student
            # in the same folder must not answer from the old one's cache
            "model_identity": model_identity(model, self.model) if cache is not None else None,
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

    def answer_masks(self, answer: type | None) -> TokenMasks | None:
        """The device masks of a request's constraint (None when unconstrained)."""
        index = self.answer_index(answer)
        if index is None:
            return None
        if id(index) not in self.token_masks:
            vocab = self.model.get_output_embeddings().weight.shape[0]
            self.token_masks[id(index)] = TokenMasks(
                index, vocab, self.tokenizer.eos_token_id, self.model.device
            )
        return self.token_masks[id(index)]

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
        prompts = {i: self.prompt_ids(requests[i]) for i in todo}
        systems = {i: _system_text(requests[i]) for i in todo}
        # all steps of all traces at once: per system prompt (a prefix the batch computes
        # once), then similar lengths sharing a batch (less padding)
        todo.sort(key=lambda i: (systems[i], -len(prompts[i])))
        size = self.batch_size or auto_batch_size(
            self.model, max((len(p) for p in prompts.values()), default=1) + self.max_new_tokens
        )
        bar = tqdm(total=len(todo), desc=f"{self.name} judge", unit="step", disable=None)
        for batch in self._batches(todo, size, [systems[i] for i in todo]):
            answers = [requests[i].answer for i in batch]
            decoded = self.generate_ids([prompts[i] for i in batch], answers)
            for i, d in zip(batch, decoded, strict=True):
                result = self._result(d, len(prompts[i]), requests[i].answer)
                if result.judge is not None and self.cache is not None:
                    self.cache.put(keys[i], self.model_ref, result)
                if result.judge is None:
                    self.meter.failed()
                results[i] = result
                self._report(requests[i], result)
            bar.update(len(batch))
        bar.close()
        return results  # type: ignore[return-value]

    def _batches(self, todo: list[int], size: int, systems: list[str]) -> Iterator[list[int]]:
        """`todo` in order, `size` at a time; with prefix sharing, a new batch also starts where
        the system prompt changes, so each batch shares its whole system prompt."""
        batch: list[int] = []
        current: str | None = None
        for i, system in zip(todo, systems, strict=True):
            if batch and (
                len(batch) == size or (self.fast and self.share_prefix and system != current)
            ):
                yield batch
                batch = []
            batch.append(i)
            current = system
        if batch:
            yield batch

    def prompt_ids(self, request: JudgeRequest) -> list[int]:
        """The token ids of a request's chat prompt, ready for the answer."""
        text = self.tokenizer.apply_chat_template(
            request.messages, add_generation_prompt=True, tokenize=False
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _report(self, request: JudgeRequest, result: JudgeResult) -> None:
        if self.on_result is not None:
            self.on_result(request, result)

    def generate_ids(
        self, prompts: Sequence[Sequence[int]], answers: Sequence[type | None] | None = None
    ) -> list[Decoded]:
        """Greedy answers of one batch of tokenized prompts, each held to its request's schema."""
        answers = answers if answers is not None else [None] * len(prompts)
        masks = [self.answer_masks(a) for a in answers]
        if self.fast:
            return self._decode_fast(prompts, masks)
        return self._decode_plain(prompts, masks)

    def _left_padded(self, prompts: Sequence[Sequence[int]]) -> tuple[Any, Any]:
        import torch

        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[row, width - len(p) :] = 1
        return ids.to(self.model.device), mask.to(self.model.device)

    def _decode_plain(
        self, prompts: Sequence[Sequence[int]], masks: Sequence[TokenMasks | None]
    ) -> list[Decoded]:
        """`model.generate` with the schema as a logits processor (the reference path)."""
        import torch
        from transformers import LogitsProcessorList

        ids, mask = self._left_padded(prompts)
        eos = self.tokenizer.eos_token_id
        constraint = SchemaConstraint(masks, eos)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                logits_processor=LogitsProcessorList([constraint]),
                return_dict_in_generate=True,
                eos_token_id=eos,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        new = out.sequences[:, ids.shape[1] :]
        logprobs = constraint.finish(new)
        decoded = []
        for row in range(new.shape[0]):
            tokens = new[row].tolist()
            n = tokens.index(eos) + 1 if eos in tokens else len(tokens)
            decoded.append(Decoded(tokens[:n], logprobs[row][:n], forward_passes=n))
        return decoded

    def _decode_fast(
        self, prompts: Sequence[Sequence[int]], masks: Sequence[TokenMasks | None]
    ) -> list[Decoded]:
        """Greedy decoding over a KV cache: rows leave the batch when they finish, and the run
        of schema-forced tokens after a chosen token joins that token's forward pass (the
        chunk is right-padded; padding stays in the cache, masked out)."""
        import torch
        from transformers import DynamicCache

        device = self.model.device
        eos, pad, limit = (
            self.tokenizer.eos_token_id,
            self.tokenizer.pad_token_id,
            self.max_new_tokens,
        )
        cache = DynamicCache()
        with torch.inference_mode():
            logits, attention = self._prefill(prompts, cache)
            next_pos = attention.sum(-1)
            rows = [Decoded([], [], 1) for _ in prompts]
            states = [m.initial() if m is not None else None for m in masks]
            active = list(range(len(prompts)))
            while active:
                scores = logits.float()  # as `generate` does before its processors
                if any(masks[r] is not None for r in active):
                    allowed = torch.stack(
                        [
                            masks[r].mask(states[r])  # type: ignore[union-attr]
                            if masks[r] is not None
                            else torch.ones(scores.shape[1], dtype=torch.bool, device=device)
                            for r in active
                        ]
                    )
                    scores = scores.masked_fill(~allowed, float("-inf"))
                chosen = scores.argmax(-1)
                picked = scores.log_softmax(-1).gather(1, chosen.view(-1, 1)).view(-1)
                keep, chunks = [], []
                for j, (r, t, lp) in enumerate(
                    zip(active, chosen.tolist(), picked.tolist(), strict=True)
                ):
                    row, m = rows[r], masks[r]
                    row.tokens.append(t)
                    row.logprobs.append(lp)
                    if t == eos or len(row.tokens) >= limit:
                        continue
                    chunk = [t]
                    if m is not None:
                        states[r] = m.advance(states[r], t)  # type: ignore[arg-type]
                        while len(row.tokens) < limit and len(m.tokens(states[r])) == 1:
                            forced = m.tokens(states[r])[0]  # type: ignore[index]
                            row.tokens.append(forced)
                            row.logprobs.append(0.0)  # the only allowed token: probability 1
                            if forced == eos:
                                break
                            states[r] = m.advance(states[r], forced)  # type: ignore[arg-type]
                            chunk.append(forced)
                    if row.tokens[-1] == eos or len(row.tokens) >= limit:
                        continue
                    keep.append(j)
                    chunks.append(chunk)
                if not keep:
                    break
                if len(keep) < len(active):
                    index = torch.tensor(keep, device=device)
                    cache.batch_select_indices(index)
                    attention, next_pos = attention[index], next_pos[index]
                    active = [active[j] for j in keep]
                width = max(len(c) for c in chunks)
                step = torch.full((len(chunks), width), pad, dtype=torch.long)
                step_mask = torch.zeros((len(chunks), width), dtype=torch.long)
                for j, c in enumerate(chunks):
                    step[j, : len(c)] = torch.tensor(c)
                    step_mask[j, : len(c)] = 1
                lengths = torch.tensor([len(c) for c in chunks], device=device)
                attention = torch.cat([attention, step_mask.to(device)], dim=1)
                out = self.model(
                    input_ids=step.to(device),
                    attention_mask=attention,
                    position_ids=next_pos[:, None] + torch.arange(width, device=device),
                    past_key_values=cache,
                    use_cache=True,
                )
                logits = out.logits[torch.arange(len(chunks), device=device), lengths - 1]
                next_pos = next_pos + lengths
                for r in active:
                    rows[r].forward_passes += 1
        return rows

    def prefix_length(self, prompts: Sequence[Sequence[int]]) -> int:
        """Tokens of a batch's prompts that `_prefill` runs once for all rows (0: none)."""
        from transformers import DynamicCache

        n = shared_prefix(prompts) if self.share_prefix else 0
        if n < MIN_SHARED_PREFIX or not hasattr(DynamicCache, "batch_repeat_interleave"):
            return 0  # too little to share, or a transformers whose cache cannot be repeated
        return n

    def _prefill(self, prompts: Sequence[Sequence[int]], cache: Any) -> tuple[Any, Any]:
        """Run the prompts into `cache`: (last-position logits, attention mask so far).

        With a shared prefix of at least `MIN_SHARED_PREFIX` tokens, the prefix runs once at
        batch 1 and its cache is repeated to every row; the rows' own tokens follow it,
        left-padded, so a row reads [prefix][padding][own tokens] with the padding masked and
        the positions those of its unpadded prompt."""
        import torch

        n = self.prefix_length(prompts)
        if n:
            prefix = torch.tensor([list(prompts[0][:n])], device=self.model.device)
            self.model(input_ids=prefix, past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.batch_repeat_interleave(len(prompts))
        ids, own = self._left_padded([p[n:] for p in prompts])
        attention = torch.cat([own.new_ones((len(prompts), n)), own], dim=1)
        logits = self.model(
            input_ids=ids,
            attention_mask=attention,
            position_ids=((attention.cumsum(-1) - 1).clamp(min=0))[:, n:],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        return logits, attention

    def _result(self, decoded: Decoded, prompt_tokens: int, answer: type | None) -> JudgeResult:
        """The judge object (or the failure) of one decoded answer, with stage confidences."""
        eos = self.tokenizer.eos_token_id
        ids = decoded.tokens
        finished = bool(ids) and ids[-1] == eos
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids)}
        self.meter.add(usage)
        if not finished:
            return JudgeResult.failed(
                f"the answer was truncated at max_new_tokens={self.max_new_tokens}", usage
            )
        body = ids[:-1]
        text = self.tokenizer.decode(body, skip_special_tokens=True)
        try:
            judge, extra = self.parse(text) if answer is None else (parse_answer(text, answer), {})
        except JudgeParseError as exc:
            return JudgeResult.failed(str(exc), usage)
        conf: dict[str, float] = {}
        if answer is None:  # stage fields of the judge schema only
            tokens = [
                (self.tokenizer.decode([t]), lp)
                for t, lp in zip(body, decoded.logprobs, strict=False)
            ]
            conf = {s: p for s, p in stage_confidences(tokens).items() if math.isfinite(p)}
        return JudgeResult(judge=judge, confidences=conf, usage=usage, extra=extra)


def _system_text(request: JudgeRequest) -> str:
    first = request.messages[0] if request.messages else {}
    return first.get("content", "") if first.get("role") == "system" else ""


def load_hf_judge(model: str, **options: Any) -> HFJudge:
    known = {
        "device", "dtype", "batch_size", "max_new_tokens", "constrained", "max_string_chars",
        "fast", "share_prefix", "cache", "meter", "on_result",
    }  # fmt: skip
    return HFJudge(model, **{k: v for k, v in options.items() if k in known and v is not None})
