"""Greedy decoding of a judge's answers in batches on transformers: the batch size that fits in
memory, decoders that give the same tokens (plain `generate`; a KV-cache loop that drops
finished rows, appends schema-forced tokens without a forward pass of their own and writes
each step into its cache in place, `kv_cache`; `generate` on a static cache, compiled on a
GPU), attention that takes the padded batches without copying key and value heads (a CPU, a
CUDA GPU), on a CPU a prefill of about one prompt a forward, and on a GPU, SDPA kept off
cuDNN's attention kernel.

The prompts share little: 117 of 1,144 tokens on average for the example steps (SmolLM2's
tokenizer), the chat template and the start of the system prompt.

Computing the prompts' shared prefix (chat template and system prompt) once per batch was
retired: on an H200 with Qwen2.5-7B's architecture it made the judge slower (0.456 steps/s
against 0.743 without it); vLLM's prefix cache does that work where it pays."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from .base import JudgeStopped
from .constrained import SchemaConstraint, TokenMasks

CPU_ROWS, GPU_ROWS = 64, 256  # the most rows `auto_batch_size` gives a batch


def auto_batch_size(model: Any, tokens_per_row: int, cap: int | None = None) -> int:
    """Rows per generation batch that fit a memory budget: a quarter of the free memory of the
    model's device (GPU) or of the machine (CPU) for the KV cache and its per-layer copies; at
    most `cap`, by default 64 on a CPU, where a forward's time grows with its rows, and 256 on
    a GPU, where it barely does: on an H100 a decode step of Qwen2.5-7B's architecture over
    1,032 tokens took 37, 39 and 24 ms at 1, 24 and 48 rows (without cuDNN's attention), and
    the host needs ~20 ms to queue one, so more rows a step are more answers a second."""
    import torch

    from .kv_cache import text_config

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
    without its key and value heads copied out to every query head:
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
    heads), and the judge's batches are left-padded, so every decode step wrote and read the
    whole cache seven times over (Qwen2.5-7B: 28 query heads, 4 key-value heads):
    - on an H200, Qwen2.5-7B's architecture, one batch of 256 judge steps (prompts of 1,032
      tokens): a decode forward took 212 ms copied, 44 ms folded; the steps took 50.8 s
      against 17.4 s (5.0 against 14.7 steps/s), with the same 256 judge objects (the judge
      bench's `hf` and `hf_grouped`, 2026-11-28);
    - on two CPU cores the copy made a padded decode step of SmolLM2-135M at batch 16 over
      1,144 tokens 2.5x slower (994 ms against 394 ms); folding a decode step's query heads
      took a padded step of two Qwen2.5-7B-shaped layers at batch 16 over 1,032 tokens from
      87-114 ms (SDPA's grouped heads) to 79-86 ms, and 367-447 ms copied.
    Returns whether the model now attends so: only an SDPA model on one of `devices` does
    (None: any; other devices keep transformers' attention until a bench shows it there)."""
    import torch

    if devices is not None and model.device.type not in devices:
        return False
    if model.config._attn_implementation != "sdpa":
        return False
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 5):  # enable_gqa: 2.5
        return False
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(GROUPED_SDPA, _grouped_sdpa)
        AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)  # the masks SDPA gets
        model.set_attn_implementation(GROUPED_SDPA)
    except (ImportError, ValueError, AttributeError):  # a transformers without these
        return False
    return True


@contextlib.contextmanager
def without_cudnn_attention(device: Any) -> Iterator[None]:
    """On a CUDA device, SDPA may choose any kernel but cuDNN's attention for the block. On an
    H100 (torch 2.11, Qwen2.5-7B's architecture) SDPA chose cuDNN's kernel for the judge's
    decode steps, and its host time was 3.9 ms a call (the judge bench's profile: 616 calls,
    2.4 s of a 4.8 s run), 28 calls a forward: a decode step took 61-106 ms at batch 1, 24 or
    48, where the weights take ~5 ms to read. Without it a padded step of batch 24 over 1,032
    tokens took 33 ms instead of 109, and the HF path answered 1.81 steps/s instead of 0.90.
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
    forward_passes: int = 0  # the model calls that produced this row's tokens


@dataclass
class DecodeStats:
    """Where the KV-cache loop's time went, summed over its batches: what sets a decode step's
    pace (the model, the device, or the loop's own host work) is read from these, on a GPU as
    on a CPU. On a GPU a forward call returns once its kernels are queued and the loop then
    waits for its tokens; on a CPU the call does the work and the waits are ~0. Batches of
    calls on several threads (a server's) add up without losing one."""

    batches: int = 0
    rows: int = 0
    prompt_tokens: int = 0  # left-padded width x rows: what the prefills computed
    forwards: int = 0  # decode forward passes, after the prefills
    prefill_s: float = 0.0  # from a batch's start until its first tokens reached the host
    model_s: float = 0.0  # inside the decode forward calls
    wait_s: float = 0.0  # waiting for each step's tokens to reach the host
    host_s: float = 0.0  # the rest: schema states, masks, the next step's inputs
    _lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    def add(self, **batch: float) -> None:
        """Count one batch: its rows, prompt tokens, forwards and seconds (the fields')."""
        with self._lock:
            self.batches += 1
            for name, value in batch.items():
                setattr(self, name, getattr(self, name) + value)

    def summary(self) -> dict[str, Any]:
        """The figures, rounded, with the time per decode forward and its shares."""
        with self._lock:
            counts = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        decode = counts["model_s"] + counts["wait_s"] + counts["host_s"]
        per = 1000 / counts["forwards"] if counts["forwards"] else 0.0
        return {
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in counts.items()},
            "forward_ms": round(decode * per, 2),
            "forward_model_ms": round(counts["model_s"] * per, 2),
            "forward_wait_ms": round(counts["wait_s"] * per, 2),
            "forward_host_ms": round(counts["host_s"] * per, 2),
        }


DECODINGS = ("loop", "generate", "static")  # GreedyDecoder's ways to decode
STATIC_WIDTH = 256  # "static" left-pads prompts to a multiple of this many tokens


RowDone = Callable[[int, "Decoded | str"], None]
"""Told of each row of a batch once, as it finishes: its index in the batch and its answer (on
vLLM's async engine, or why there is none)."""


def tell_finished(
    on_row: RowDone | None,
    rows: Sequence[Decoded | str],
    active: Sequence[int],
    keep: Sequence[int],
) -> None:
    """Tell `on_row` of the rows of `active` that this decode step finished (not in `keep`)."""
    if on_row is None:
        return
    going_on = {active[j] for j in keep}
    for r in active:
        if r not in going_on:
            on_row(r, rows[r])


class _StopSet:
    """A stopping criterion of `generate`: every row ends once `stop` is set."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        return torch.full((input_ids.shape[0],), self.stop.is_set(), device=input_ids.device)


@contextlib.contextmanager
def _stoppable(stop: threading.Event | None) -> Iterator[None]:
    """`JudgeStopped` after a `generate` that `stop` ended (its answers are cut, not kept)."""
    yield
    if stop is not None and stop.is_set():
        raise JudgeStopped("the judge call was stopped")


def check_decoding(decoding: str) -> str:
    """`decoding` if it is one of `DECODINGS`, else a ValueError naming them."""
    if decoding not in DECODINGS:
        raise ValueError(f"decoding must be one of {', '.join(DECODINGS)}, got {decoding!r}")
    return decoding


def kept_in_place(keep: Sequence[int]) -> list[int]:
    """The rows `keep` of a batch (ascending) in the order that moves the fewest: each keeps
    its place, and a dropped row's place below `len(keep)` takes a kept row from past it. The
    KV cache then copies only those rows when the batch shrinks, not every row after the first
    one dropped."""
    kept, n = set(keep), len(keep)
    movers = iter(j for j in keep if j >= n)
    return [j if j in kept else next(movers) for j in range(n)]


class GreedyDecoder:
    """Greedy answers of one batch of tokenized prompts, each row held to its own token masks
    (None: free). `decoding` says how:
    - "loop": the KV-cache loop (`_decode_loop`), the package's default;
    - "generate": plain `model.generate` with the masks as a logits processor (the reference);
    - "static": the same `generate` on transformers' static cache, where on a GPU it compiles
      its decode step (CUDA graphs, no host time per kernel) once per shape. A batch is padded
      to a power of two rows, at most `rows` (copies of its last prompt, answers dropped), and
      its prompts to a multiple of 256 tokens, so that calls of any size reuse a few shapes.
      On an H200 (Qwen2.5-7B's architecture, 256 judge steps, both on copied key-value heads)
      it gave 5.5 steps/s against the loop's 5.1, after a 77 s warm-up that compiled it; the
      loop on folded heads gave 14.7. On folded heads it is not measured yet.
    "loop" and "static" decode without cuDNN's attention kernel on a GPU."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_new_tokens: int,
        *,
        decoding: str = "loop",
        rows: int | None = None,
        stats: DecodeStats | None = None,
    ) -> None:
        self.model, self.tokenizer, self.max_new_tokens = model, tokenizer, max_new_tokens
        self.decoding, self.rows = check_decoding(decoding), rows
        self.stats = stats if stats is not None else DecodeStats()  # the loop's timings

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        masks: Sequence[TokenMasks | None],
        *,
        stop: threading.Event | None = None,
        on_row: RowDone | None = None,
    ) -> list[Decoded]:
        """The answers of a batch. `stop`, set from another thread, ends it between two decode
        steps (`JudgeStopped`); `on_row` is told of each row once, as it finishes (in the loop,
        one by one; the other decodings finish their rows together, at the end)."""
        if self.decoding == "loop":
            with without_cudnn_attention(self.model.device):  # the kernels that suit decode steps
                return self._decode_loop(prompts, masks, stop, on_row)
        with _stoppable(stop):
            if self.decoding == "generate":  # `generate` as transformers and torch give it
                rows = self._decode_plain(prompts, masks, stop=stop)
            else:
                with without_cudnn_attention(self.model.device):
                    rows = self._decode_static(prompts, masks, stop)
        tell_finished(on_row, rows, range(len(rows)), [])
        return rows

    def _decode_static(
        self,
        prompts: Sequence[Sequence[int]],
        masks: Sequence[TokenMasks | None],
        stop: threading.Event | None = None,
    ) -> list[Decoded]:
        """`generate` on a static cache, in shapes a compiled decode step can be reused for."""
        n = len(prompts)
        fill = max(0, min(self.rows or n, 1 << (n - 1).bit_length()) - n)
        longest = max(len(p) for p in prompts)
        return self._decode_plain(
            [*prompts, *[prompts[-1]] * fill],
            [*masks, *[masks[-1]] * fill],
            width=-(-longest // STATIC_WIDTH) * STATIC_WIDTH,
            stop=stop,
            cache_implementation="static",
        )[:n]

    def _left_padded(
        self, prompts: Sequence[Sequence[int]], width: int | None = None
    ) -> tuple[Any, Any]:
        import torch

        width = max([width or 0, *(len(p) for p in prompts)])
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
        return ids.to(self.model.device), self._left_padding_mask(prompts, width)

    def _left_padding_mask(self, prompts: Sequence[Sequence[int]], width: int) -> Any:
        """The attention mask of `prompts` left-padded to `width`: 0 on padding, 1 on tokens."""
        import torch

        rows = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
        return torch.tensor(rows, dtype=torch.long, device=self.model.device)

    def _decode_plain(
        self,
        prompts: Sequence[Sequence[int]],
        masks: Sequence[TokenMasks | None],
        width: int | None = None,
        stop: threading.Event | None = None,
        **settings: Any,
    ) -> list[Decoded]:
        """`model.generate` with the schema as a logits processor (the reference path), the
        prompts left-padded to `width` at least; `settings` go to `generate`. `stop` set ends
        it at the next token (`_stoppable` then raises `JudgeStopped`)."""
        import torch
        from transformers import LogitsProcessorList, StoppingCriteriaList

        ids, mask = self._left_padded(prompts, width)
        eos = self.tokenizer.eos_token_id
        constraint = SchemaConstraint(masks, eos)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                logits_processor=LogitsProcessorList([constraint]),
                stopping_criteria=StoppingCriteriaList([_StopSet(stop)] if stop else []),
                return_dict_in_generate=True,
                eos_token_id=eos,
                pad_token_id=self.tokenizer.pad_token_id,
                **settings,
            )
        new = out.sequences[:, ids.shape[1] :]
        logprobs = constraint.finish(new)
        decoded = []
        for row in range(new.shape[0]):
            tokens = new[row].tolist()
            n = tokens.index(eos) + 1 if eos in tokens else len(tokens)
            decoded.append(Decoded(tokens[:n], logprobs[row][:n], forward_passes=n))
        return decoded

    def _decode_loop(
        self,
        prompts: Sequence[Sequence[int]],
        masks: Sequence[TokenMasks | None],
        stop: threading.Event | None = None,
        on_row: RowDone | None = None,
    ) -> list[Decoded]:
        """Greedy decoding over a KV cache: rows leave the batch when they finish, and the run
        of schema-forced tokens after a chosen token joins that token's forward pass (the
        chunk is left-padded; padding stays in the cache, masked out)."""
        import torch

        from .kv_cache import growing_cache

        limit = self.max_new_tokens
        cache = growing_cache(self.model, room=limit)  # a step writes its tokens in place
        clock = time.perf_counter
        started, decoding_since, model_s, wait_s, forwards = clock(), 0.0, 0.0, 0.0, 0
        with torch.inference_mode():
            logits, attention = self._prefill(prompts, cache)
            prompt_width = attention.shape[1]
            next_pos = attention.sum(-1)
            rows = [Decoded([], [], 1) for _ in prompts]
            states = [m.initial() if m is not None else None for m in masks]
            active = list(range(len(prompts)))
            while active:
                if stop is not None and stop.is_set():
                    raise JudgeStopped("the judge call was stopped")
                chosen, picked = self._choose(logits, [masks[r] for r in active],
                                              [states[r] for r in active])  # fmt: skip
                asked = clock()
                tokens, logprobs = chosen.tolist(), picked.tolist()  # waits for the device
                if not decoding_since:  # the prefill's tokens: its time ends here
                    decoding_since = clock()
                else:
                    wait_s += clock() - asked
                keep, chunks = self._advance(rows, masks, states, active, tokens, logprobs)
                tell_finished(on_row, rows, active, keep)
                if not keep:
                    break
                if len(keep) < len(active):
                    chunk_of = dict(zip(keep, chunks, strict=True))
                    keep = kept_in_place(keep)
                    chunks = [chunk_of[j] for j in keep]
                    index = torch.tensor(keep, device=self.model.device)
                    cache.batch_select_indices(index)
                    attention, next_pos = attention[index], next_pos[index]
                    active = [active[j] for j in keep]
                logits, attention, next_pos, seconds = self._forward(
                    chunks, attention, next_pos, cache
                )
                model_s += seconds
                forwards += 1
                for r in active:
                    rows[r].forward_passes += 1
        self.stats.add(
            rows=len(prompts),
            prompt_tokens=len(prompts) * prompt_width,
            forwards=forwards,
            prefill_s=decoding_since - started,
            model_s=model_s,
            wait_s=wait_s,
            # what the forwards and the waits leave of the decoding: the loop's own work
            host_s=clock() - decoding_since - model_s - wait_s,
        )
        return rows

    def _choose(
        self, logits: Any, masks: Sequence[TokenMasks | None], states: Sequence[Any]
    ) -> tuple[Any, Any]:
        """(the greedy token, its log-probability) of each active row, held to its schema
        (`masks[i]` in state `states[i]`), as tensors on the device."""
        import torch

        # as `generate` does before its processors; the logits are this step's own, so the mask
        # is applied in place
        scores = logits.float()
        if any(m is not None for m in masks):
            allowed = torch.stack(
                [
                    m.mask(state)
                    if m is not None
                    else torch.ones(scores.shape[1], dtype=torch.bool, device=self.model.device)
                    for m, state in zip(masks, states, strict=True)
                ]
            )
            scores.masked_fill_(allowed.logical_not_(), float("-inf"))
        chosen = scores.argmax(-1)
        return chosen, scores.log_softmax(-1).gather(1, chosen.view(-1, 1)).view(-1)

    def _advance(
        self,
        rows: list[Decoded],
        masks: Sequence[TokenMasks | None],
        states: list[Any],
        active: Sequence[int],
        tokens: Sequence[int],
        logprobs: Sequence[float],
    ) -> tuple[list[int], list[list[int]]]:
        """Append each active row's chosen token and the run of schema-forced tokens after it;
        (the positions in `active` of the rows that go on, the chunk each feeds the next
        forward). A row ends at end-of-sequence or at the token budget."""
        eos, limit = self.tokenizer.eos_token_id, self.max_new_tokens
        keep, chunks = [], []
        for j, (r, t, lp) in enumerate(zip(active, tokens, logprobs, strict=True)):
            row, m = rows[r], masks[r]
            row.tokens.append(t)
            row.logprobs.append(lp)
            if t == eos or len(row.tokens) >= limit:
                continue
            chunk = [t]
            if m is not None:
                states[r] = m.advance(states[r], t)
                while len(row.tokens) < limit:
                    forced = m.forced(states[r])
                    if forced is None:
                        break
                    row.tokens.append(forced)
                    row.logprobs.append(0.0)  # the only allowed token: probability 1
                    if forced == eos:
                        break
                    states[r] = m.advance(states[r], forced)
                    chunk.append(forced)
            if row.tokens[-1] == eos or len(row.tokens) >= limit:
                continue
            keep.append(j)
            chunks.append(chunk)
        return keep, chunks

    def _forward(
        self, chunks: Sequence[Sequence[int]], attention: Any, next_pos: Any, cache: Any
    ) -> tuple[Any, Any, Any, float]:
        """One forward of every row's chunk: (the last position's logits, the attention mask
        and the next positions, both grown by the chunks, the model's own seconds)."""
        import torch

        device, pad = self.model.device, self.tokenizer.pad_token_id
        width = max(len(c) for c in chunks)
        # left-padded, so that every row's last token is the chunk's last position: the model
        # computes the logits of that position only (`logits_to_keep`), not of every forced
        # token. Built as lists, one tensor each: a tensor write per row cost ~10 us a row.
        step = torch.tensor([[pad] * (width - len(c)) + list(c) for c in chunks])
        step_mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in chunks])
        lengths = torch.tensor([len(c) for c in chunks], device=device)
        attention = torch.cat([attention, step_mask.to(device)], dim=1)
        # a row's tokens continue its positions; its padding takes its first one
        offsets = torch.arange(width, device=device) - (width - lengths)[:, None]
        called = time.perf_counter()
        out = self.model(
            input_ids=step.to(device),
            attention_mask=attention,
            position_ids=next_pos[:, None] + offsets.clamp(min=0),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        seconds = time.perf_counter() - called
        return out.logits[:, -1], attention, next_pos + lengths, seconds

    def _prefill(self, prompts: Sequence[Sequence[int]], cache: Any) -> tuple[Any, Any]:
        """Run the left-padded prompts into `cache`: (last-position logits, attention mask).
        On a CPU a part of the batch at a time (`prefill_rows`), each into its rows of the
        cache, left-padded to its own width only."""
        import torch
        from transformers import DynamicCache

        from .kv_cache import GrowingLayer

        width = max(len(p) for p in prompts)
        rows = prefill_rows(self.model, width)
        # parts are placed into growing layers; transformers' own cache (a sliding window)
        # has no layers before its first update, and takes the batch in one forward
        growing = bool(cache.layers) and all(isinstance(x, GrowingLayer) for x in cache.layers)
        if rows >= len(prompts) or not growing:
            ids, attention = self._left_padded(prompts)
            return self._forward_prompts(ids, attention, cache), attention
        logits = []
        for first in range(0, len(prompts), rows):
            part_ids, part_attention = self._left_padded(prompts[first : first + rows])
            part = DynamicCache()
            logits.append(self._forward_prompts(part_ids, part_attention, part))
            for layer, done in zip(cache.layers, part.layers, strict=True):
                layer.place(done.keys, done.values, first, len(prompts), width)
        return torch.cat(logits), self._left_padding_mask(prompts, width)

    def _forward_prompts(self, ids: Any, attention: Any, cache: Any) -> Any:
        """One forward of left-padded prompts into `cache`: their last position's logits."""
        return self.model(
            input_ids=ids,
            attention_mask=attention,
            position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]


CPU_PREFILL_TOKENS = 1024  # on a CPU a prefill takes rows up to about this many tokens


def prefill_rows(model: Any, width: int) -> int:
    """How many of a batch's prompts (left-padded to `width` tokens) one prefill forward takes.
    On a CPU, a part of about `CPU_PREFILL_TOKENS` tokens (one judge prompt): 16 prompts of
    SmolLM2-135M, 1,144 tokens on average, took 24 s one at a time, 31 s four at a time and
    47 s all at once on two cores; a lone prompt has no padding, and none of its attention
    masked. On a GPU, the whole batch (as measured there)."""
    if model.device.type != "cpu":
        return 1 << 30
    return max(1, CPU_PREFILL_TOKENS // max(1, width))
