"""Greedy, schema-constrained answers of a judge in batches on transformers: `generate` with
the constraint as a logits processor (`constrained.GuideConstraint`), the batch size that fits
in memory, attention that takes the padded batches without copying key and value heads (a CPU,
a CUDA GPU), and on a GPU, SDPA kept off cuDNN's attention kernel.

A decoding loop of the package's own (a KV cache written in place, rows dropped, forced tokens
fed together) was retired for `generate()`: vLLM in process is the engine for speed."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

CPU_ROWS, GPU_ROWS = 64, 256  # the most rows `auto_batch_size` gives a batch


def text_config(model: Any) -> Any:
    """The config of `model`'s language model (its own, or a multimodal model's text part):
    the layers, heads and head size its KV cache has."""
    return model.config.get_text_config() or model.config


def auto_batch_size(model: Any, tokens_per_row: int, cap: int | None = None) -> int:
    """Rows per generation batch that fit a memory budget: a quarter of the free memory of the
    model's device (GPU) or of the machine (CPU) for the KV cache and its per-layer copies; at
    most `cap`, by default 64 on a CPU, where a forward's time grows with its rows, and 256 on
    a GPU, where it barely does (BENCHMARKS, the GPU runs)."""
    import torch

    config = text_config(model)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    width = next(model.parameters()).element_size()
    # the cache (K and V, all layers) plus one layer's K and V repeated to every query head
    per_token = 2 * head_dim * width * (config.num_hidden_layers * kv_heads + heads)
    if model.device.type == "cuda":  # free on the device, and free in torch's own pool
        pool = torch.cuda.memory_reserved(model.device) - torch.cuda.memory_allocated(model.device)
        free, most = torch.cuda.mem_get_info(model.device)[0] + pool, GPU_ROWS
    else:
        free, most = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), CPU_ROWS
    rows = int(free // 4 // max(1, per_token * tokens_per_row))
    return max(1, min(most if cap is None else cap, rows))


GROUPED_SDPA = "stepgap_grouped_sdpa"  # the attention implementation `attend_grouped` sets
FOLDED_QUERIES = 64  # a masked query of at most this many tokens (a decode step) is folded


def _grouped_sdpa(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' SDPA attention, but a masked batch of a grouped-query model attends
    without its key and value heads copied out to every query head. One of the package's two
    leans on a library's undocumented side (docs/architecture.md): it follows the layouts of
    transformers' `sdpa_attention_forward`, which its tests compare it with:
    - a short query (a decode step and its forced tokens, at most `FOLDED_QUERIES`): the query
      heads that share a key-value head become rows of one query of that head, the mask
      repeated to match, so any SDPA kernel that takes a mask (CUDA's memory-efficient one
      too) reads each key and value head once;
    - anything else on a CPU (a prompt, a mask per head): SDPA's own grouped heads
      (`enable_gqa`);
    and the rest (no mask, no groups, a position bias, a paged cache, anything else off a CPU,
    whose kernels take no mask with grouped heads) goes to transformers'."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    special = kwargs.get("position_bias") is not None or kwargs.get("cache") is not None
    batch, heads, length, dim = query.shape
    masked = attention_mask is not None and groups > 1 and not special
    fold = masked and length <= FOLDED_QUERIES and attention_mask.shape[1] == 1
    if not (fold or (masked and query.device.type == "cpu")):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask,
            dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs,
        )  # fmt: skip
    if fold:
        # query head h reads key-value head h // groups (transformers' `repeat_kv` order)
        folded = query.reshape(batch, key.shape[1], groups * length, dim)
        out = torch.nn.functional.scaled_dot_product_attention(
            folded, key, value, attn_mask=attention_mask.repeat(1, 1, groups, 1),
            dropout_p=dropout, scale=scaling,
        )  # fmt: skip
        out = out.reshape(batch, heads, length, dim)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
            enable_gqa=True,
        )  # fmt: skip
    return out.transpose(1, 2).contiguous(), None


def attend_grouped(model: Any, devices: tuple[str, ...] | None = ("cpu", "cuda")) -> bool:
    """Let a padded batch of a grouped-query model (Qwen2.5, SmolLM2) attend without copied
    heads (`_grouped_sdpa`). transformers copies the key and value heads out to every query
    head whenever an attention mask is given (CUDA's fast kernels take no mask with grouped
    heads), and the judge's batches are left-padded, so every decode step would write and read
    the whole cache seven times over (Qwen2.5-7B: 28 query heads, 4 key-value heads): on an
    H200 a decode forward took about a fifth of the time folded (BENCHMARKS, the GPU runs).
    Returns whether the model now attends so: a model on one of `devices` (None: any; other
    devices keep transformers' attention until a bench shows it there) that transformers lets
    attend with SDPA (it checks an implementation named so as it checks "sdpa", and refuses a
    model that cannot: that one keeps its own)."""
    import torch

    if devices is not None and model.device.type not in devices:
        return False
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 5):  # enable_gqa: 2.5
        return False
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(GROUPED_SDPA, _grouped_sdpa)
        AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)  # the masks SDPA gets
        model.set_attn_implementation(GROUPED_SDPA)
    except (ImportError, ValueError):  # a transformers without these, a model without SDPA
        return False
    return True


@contextlib.contextmanager
def without_cudnn_attention(device: Any) -> Iterator[None]:
    """On a CUDA device, SDPA may choose any kernel but cuDNN's attention for the block: on an
    H100 cuDNN's kernel cost the judge's decode steps milliseconds of host time a call, and
    without it the HF path answered twice as many steps a second (BENCHMARKS, the GPU runs).
    Elsewhere this changes nothing."""
    import torch

    if torch.device(device).type != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    with sdpa_kernel(backends):
        yield


@dataclass
class Decoded:
    """One row's generated tokens and their log-probabilities under the constraint."""

    tokens: list[int]
    logprobs: list[float]


RowDone = Callable[[int, "Decoded | str"], None]
"""Told of each row of a batch once, as it finishes: its index in the batch and its answer (on
vLLM's async engine, or why there is none)."""


def tell_finished(on_row: RowDone | None, rows: Sequence[Decoded | str]) -> None:
    """Tell `on_row` of each row of a finished batch, in order."""
    if on_row is not None:
        for r, row in enumerate(rows):
            on_row(r, row)


class _StopSet:
    """A stopping criterion of `generate`: every row ends once `stop` is set."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        return torch.full((input_ids.shape[0],), self.stop.is_set(), device=input_ids.device)


def generate_answers(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    indexes: Sequence[Any],
    max_new_tokens: int,
    stop: threading.Event | None = None,
    on_row: RowDone | None = None,
) -> list[Decoded]:
    """Greedy answers of one batch of tokenized prompts (left-padded), each row held to its
    outlines-core index (None: free), by `model.generate`. `stop`, set from another thread,
    ends it at the next token (`JudgeStopped`: its cut answers are not kept); `on_row` is told
    of each row once: as its EOS is written, or at the end (an answer cut at the budget)."""
    import torch
    from transformers import LogitsProcessorList, StoppingCriteriaList

    from .base import JudgeStopped
    from .constrained import GuideConstraint

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    told: set[int] = set()

    def answer(tokens: list[int], logprobs: list[float]) -> Decoded:
        n = tokens.index(eos) + 1 if eos in tokens else len(tokens)  # its EOS, or the budget
        return Decoded(tokens[:n], logprobs[:n])

    def tell(row: int, decoded: Decoded) -> None:
        if on_row is not None and row not in told:
            told.add(row)
            on_row(row, decoded)

    def finished(row: int, tokens: list[int], logprobs: list[float]) -> None:
        tell(row, answer(tokens, logprobs))

    constraint = GuideConstraint(indexes, eos, len(tokenizer), finished, width)
    with torch.inference_mode(), without_cudnn_attention(model.device):
        out = model.generate(
            input_ids=ids.to(model.device),
            attention_mask=mask.to(model.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            logits_processor=LogitsProcessorList([constraint]),
            stopping_criteria=StoppingCriteriaList([_StopSet(stop)] if stop else []),
            return_dict_in_generate=True,
            eos_token_id=eos,
            pad_token_id=pad,
        )
    if stop is not None and stop.is_set():
        raise JudgeStopped("the judge call was stopped")
    new = out.sequences[:, width:]
    logprobs = constraint.finish(new)
    decoded = [answer(tokens, logprobs[row]) for row, tokens in enumerate(new.tolist())]
    for row, d in enumerate(decoded):
        tell(row, d)
    return decoded
