"""Schema-constrained decoding: a judge schema as a regular expression, its outlines-core index
over a tokenizer's vocabulary, and the per-row token masks a decoder applies, so every finished
answer parses. The masks also keep the constrained token probabilities that the stage
confidences are read from."""

from __future__ import annotations

import array
import json
import re
from collections.abc import Sequence
from typing import Any

from .base import judge_json_schema


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

    return Index(regex, Vocabulary(tokenizer.eos_token_id, token_bytes(tokenizer)))


_LLAMA_BYTE = re.compile(r"^<0x[0-9A-F]{2}>$")
_REPLACEMENT = re.compile(r"^.{0,6}\ufffd+.{0,6}$")


def token_bytes(tokenizer: Any) -> dict[bytes, list[int]]:
    """The bytes each token writes (special tokens out): a token that is part of a multi-byte
    character is that byte (`<0xE2>`, or a byte-level BPE symbol), not a replacement character
    that would count as a whole character of the schema. The same reading as vLLM's and
    outlines' own, so a schema allows the same tokens on the HF path as on vLLM."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    to_byte = {v: k for k, v in bytes_to_unicode().items()}
    special = set(tokenizer.all_special_ids)
    out: dict[bytes, list[int]] = {}
    for token, tid in tokenizer.get_vocab().items():
        if tid in special:
            continue
        text = tokenizer.convert_tokens_to_string([token])
        if token.startswith("\u2581") or token == "<0x20>":  # SentencePiece's leading space
            text = " " + text
        if not text:
            continue
        if (text == "\ufffd" and token != "\ufffd") or (
            "\ufffd" in text and not _REPLACEMENT.match(text)
        ):
            if _LLAMA_BYTE.match(token):
                data = bytes([int(token[3:5], 16)])
            elif all(c in to_byte for c in token):
                data = bytes(to_byte[c] for c in token)
            else:
                continue  # neither spelling of a byte: not a token the schema can use
        else:
            data = text.encode("utf-8")
        out.setdefault(data, []).append(tid)
    return out


class TokenMasks:
    """The allowed tokens of an index's states, each state's mask built once on the model's
    device (not a full-vocabulary mask per row per token on the CPU). A string state allows
    most of the vocabulary (147k of Qwen2.5's 152k tokens), and a judge answer visits hundreds
    of states: a mask is built from the index's list in one tensor operation, and only a
    state's forced token (where it allows one) is kept on the CPU."""

    def __init__(self, index: Any, vocab: int, eos: int, device: Any) -> None:
        self.index, self.vocab, self.eos, self.device = index, vocab, eos, device
        self._forced: dict[int, int | None] = {}
        self._masks: dict[int, Any] = {}

    def initial(self) -> int:
        return self.index.get_initial_state()

    def _read(self, state: int) -> None:
        """Fetch `state`'s token list from the index once: its forced token where it allows
        one, else its mask (the next step's logits need it)."""
        if state in self._forced:
            return
        allowed = self.index.get_allowed_tokens(state)
        if len(allowed) == 1:
            self._forced[state] = allowed[0]
        else:
            self._forced[state] = None
            self._masks[state] = self._mask_of(allowed)

    def _mask_of(self, tokens: Sequence[int]) -> Any:
        """The mask of a token list. A string state's list holds ~147k of Qwen's ids: through
        `array` it becomes a tensor in 5 ms, where `torch.tensor` on the list took 18 ms (two
        CPU cores), and a judge answer reaches a few hundred states."""
        import torch

        mask = torch.zeros(self.vocab, dtype=torch.bool)
        if tokens:  # (frombuffer refuses an empty buffer)
            allowed = torch.frombuffer(array.array("q", tokens), dtype=torch.int64)
            mask[allowed[allowed < self.vocab]] = True
        return mask.to(self.device)

    def forced(self, state: int) -> int | None:
        """The one token `state` allows, or None where it allows several."""
        self._read(state)
        return self._forced[state]

    def mask(self, state: int) -> Any:
        """Boolean (vocab,) tensor: True where a token is allowed in `state`."""
        self._read(state)
        if state not in self._masks:  # a forced state, under `generate`'s logits processor
            self._masks[state] = self._mask_of([self._forced[state]])  # type: ignore[list-item]
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
            # one copy from the device per step, not one per row
            for i, (m, last) in enumerate(zip(self.masks, input_ids[:, -1].tolist(), strict=True)):
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
