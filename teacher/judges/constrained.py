"""Schema-constrained decoding on transformers' `generate`: a judge schema as a regular
expression, its outlines-core index over a tokenizer's vocabulary, and `GuideConstraint`, the
logits processor that holds each row to its index through outlines-core's own `Guide` and torch
kernels, so every finished answer parses. The processor also keeps the constrained token
probabilities that the stage confidences are read from."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
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


def byte_symbols() -> dict[int, str]:
    """The printable character byte-level BPE (GPT-2's, and Qwen's, SmolLM2's) writes for each
    byte: the printable Latin-1 bytes stand for themselves, the others take the code points from
    256 up, in byte order (the mapping those tokenizers' vocabularies are written in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    symbols = {b: chr(b) for b in printable}
    others = (b for b in range(256) if b not in symbols)
    symbols.update({b: chr(256 + n) for n, b in enumerate(others)})
    return dict(sorted(symbols.items()))


_LLAMA_BYTE = re.compile(r"^<0x[0-9A-F]{2}>$")
_REPLACEMENT = re.compile(r"^.{0,6}\ufffd+.{0,6}$")


def token_bytes(tokenizer: Any) -> dict[bytes, list[int]]:
    """The bytes each token writes (special tokens out): a token that is part of a multi-byte
    character is that byte (`<0xE2>`, or a byte-level BPE symbol), not a replacement character
    that would count as a whole character of the schema. The same reading as vLLM's and
    outlines' own, so a schema allows the same tokens on the HF path as on vLLM."""
    to_byte = {v: k for k, v in byte_symbols().items()}
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


class GuideConstraint:
    """A `generate` logits processor that keeps each row on its outlines-core index (None: that
    row is free): a `Guide` per row follows the row's tokens, writes the tokens it allows next
    into the row of a bitmask (`fill_next_token_bitmask`), and outlines-core's torch kernel
    sets the others to -inf in place (`apply_token_bitmask_inplace`). A finished row (its EOS
    written) is left alone: `generate` pads it. The chosen tokens' log-probabilities under the
    constraint are kept (`finish`), so `generate` need not return batch x steps x vocab scores.
    `vocab`: the tokenizer's size, which the bitmask covers when the logits are narrower;
    `on_finished(row, tokens, logprobs)` is told of a row as soon as its EOS is written
    (`prompt_width`: where its answer starts in `generate`'s ids)."""

    def __init__(
        self,
        indexes: Sequence[Any],
        eos_token_id: int,
        vocab: int = 0,
        on_finished: Callable[[int, list[int], list[float]], None] | None = None,
        prompt_width: int = 0,
    ) -> None:
        from outlines_core import Guide

        self.guides = [Guide(i) if i is not None else None for i in indexes]
        self.eos, self.vocab = eos_token_id, vocab
        self.on_finished, self.prompt_width = on_finished, prompt_width
        self.done = [False] * len(indexes)
        self.picked: list[Any] = []  # each step's chosen tokens' log-probabilities (device)
        self.bitmask: Any = None
        self._last: Any = None  # the previous step's log-softmax of the processed scores

    def _record(self, chosen: Any) -> None:
        self.picked.append(self._last.gather(1, chosen.view(-1, 1).to(self._last.device)))

    def _advance(self, input_ids: Any) -> None:
        last = input_ids[:, -1]
        self._record(last)
        for i, token in enumerate(last.tolist()):  # one copy from the device per step
            guide = self.guides[i]
            if self.done[i]:
                continue
            if token == self.eos:
                self.done[i] = True
                if self.on_finished is not None:
                    tokens = input_ids[i, self.prompt_width :].tolist()
                    self.on_finished(i, tokens, self._logprobs(i))
            elif guide is not None:
                guide.advance(token)

    def _mask(self, scores: Any) -> None:
        import torch
        from outlines_core.kernels.torch import apply_token_bitmask_inplace, fill_next_token_bitmask

        if self.bitmask is None:
            words = (max(scores.shape[1], self.vocab) + 31) // 32
            self.bitmask = torch.full((len(self.guides), words), -1, dtype=torch.int32)
        for i, guide in enumerate(self.guides):
            if guide is not None and not self.done[i]:
                fill_next_token_bitmask(guide, self.bitmask[i : i + 1])
        apply_token_bitmask_inplace(scores, self.bitmask.to(scores.device, non_blocking=True))

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self._last is not None:
            self._advance(input_ids)
        if any(g is not None for g in self.guides):
            self._mask(scores)
        self._last = scores.float().log_softmax(-1)
        return scores

    def _logprobs(self, row: int | None = None) -> Any:
        """The log-probabilities so far: every row's (lists), or one row's (a list), copied
        from the device for that row alone as it finishes."""
        import torch

        if not self.picked:
            return [] if row is not None else [[] for _ in self.guides]
        picked = torch.cat(self.picked, dim=1)
        return (picked if row is None else picked[row]).tolist()

    def finish(self, new_tokens: Any) -> list[list[float]]:
        """Log-probabilities of every generated token, row by row (`new_tokens`: batch x steps)."""
        if self._last is not None and new_tokens.shape[1] > len(self.picked):
            self._record(new_tokens[:, -1])
        return self._logprobs()
