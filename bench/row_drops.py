"""What a shrinking batch costs the judge's KV cache: the HF path's decoding loop drops each row
from the batch as its answer ends, so one batch of N rows shrinks up to N times. Side by side in
one run, over the same drops:

- `dynamic`: transformers' `DynamicLayer.batch_select_indices`, a gather of every kept row's
  keys and values into new memory at each drop (what the judge's cache did before it kept rows
  in place, there over its whole buffer, the answer's room included);
- `growing`: the judge's `GrowingCache` of `GrowingLayer`s, the rows in the loop's order
  (`kept_in_place`): kept rows stay where they are, only rows from past the new end move into
  freed places, within the same buffer; the rows to move are found once a drop, for every
  layer.

    python bench/row_drops.py [--rows 16] [--layers 30] [--kv-heads 3] [--head-dim 64]
        [--prompt 1144] [--answer 256] [--dtype float32] [--device cpu]

Defaults: the CPU table's batch of SmolLM2-135M (16 rows of 1,144-token prompts, fp32). The
7B student's batch on a GPU: `--rows 256 --layers 28 --kv-heads 4 --head-dim 128 --prompt 1036
--answer 320 --dtype bfloat16 --device cuda` (~20 GB of cache). Answer lengths are drawn
(seeded) between a third of `--answer` and all of it; a row leaves after its last token. Only
the drops are timed (the decode steps between them are not run). Prints seconds and bytes moved
for each, and their ratio; writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from stepgap.teacher.judges.decoding import kept_in_place
from stepgap.teacher.judges.kv_cache import GrowingCache, GrowingLayer

OUT = Path(__file__).resolve().parent / "results"


def schedule(rows: int, answer: int, seed: int) -> list[tuple[int, list[int]]]:
    """(decode step, the rows kept) for each step where some row ends, the rows numbered by
    their place in the batch at that step, as the loop sees them; the last rows' end is no
    drop (the loop stops)."""
    ends = random.Random(seed).choices(range(max(1, answer // 3), answer + 1), k=rows)
    batch = list(range(rows))  # row id at each place
    drops = []
    for step in sorted(set(ends)):
        keep = [j for j, r in enumerate(batch) if ends[r] != step]
        if keep:
            drops.append((step, keep))
        batch = [batch[j] for j in kept_in_place(keep)]
    return drops


def run(kind: str, args: argparse.Namespace, drops: list[tuple[int, list[int]]]) -> dict:
    """One cache kind's layers through `drops`: seconds in `batch_select_indices` and bytes
    it moved (the kept rows' filled positions for `dynamic`, the moved rows' for `growing`)."""
    dtype, device = getattr(torch, args.dtype), torch.device(args.device)
    shape = (args.rows, args.kv_heads, args.prompt + args.answer, args.head_dim)
    layers: list[Any] = []
    for _ in range(args.layers):
        if kind == "growing":
            layer = GrowingLayer(room=args.answer)
            layer.buffers = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in "kv")
        else:
            layer = DynamicLayer()
            layer.keys, layer.values = (
                torch.zeros(shape, dtype=dtype, device=device) for _ in "kv"
            )
            layer.is_initialized = True
        layers.append(layer)
    # transformers' cache drops rows layer by layer; the judge's finds the rows to move once
    cache = GrowingCache(layers=layers) if kind == "growing" else Cache(layers=layers)
    item = torch.empty((), dtype=dtype).element_size()
    seconds, moved = 0.0, 0
    for step, keep in drops:
        length = args.prompt + step
        order = kept_in_place(keep) if kind == "growing" else keep
        index = torch.tensor(order, device=device)
        for layer in layers:  # `length` positions filled, as at this step of the loop
            if kind == "growing":
                layer.length = length
            else:
                layer.keys, layer.values = (t[..., :length, :] for t in (layer.keys, layer.values))
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        cache.batch_select_indices(index)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - start
        rows = sum(o != j for j, o in enumerate(order)) if kind == "growing" else len(order)
        moved += 2 * args.layers * rows * args.kv_heads * length * args.head_dim * item
        if kind == "dynamic":  # the next drop reads positions past these: the layer's own shape
            for layer in layers:
                grown = (len(order), args.kv_heads, args.prompt + args.answer, args.head_dim)
                layer.keys, layer.values = (
                    torch.zeros(grown, dtype=dtype, device=device) for _ in "kv"
                )
    return {
        "seconds": round(seconds, 4),
        "bytes_moved": moved,
        "gib_moved": round(moved / 2**30, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--rows", type=int, default=16, help="rows in the batch")
    p.add_argument("--layers", type=int, default=30, help="the model's layers")
    p.add_argument("--kv-heads", type=int, default=3, help="key-value heads a layer")
    p.add_argument("--head-dim", type=int, default=64, help="a head's size")
    p.add_argument("--prompt", type=int, default=1144, help="prompt positions (padded width)")
    p.add_argument("--answer", type=int, default=256, help="answer token limit")
    p.add_argument("--dtype", default="float32", help="the cache's dtype")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--seed", type=int, default=0, help="the answer lengths' seed")
    args = p.parse_args()
    drops = schedule(args.rows, args.answer, args.seed)
    results = {kind: run(kind, args, drops) for kind in ("dynamic", "growing")}
    ratio = results["dynamic"]["seconds"] / max(results["growing"]["seconds"], 1e-9)
    report = {"settings": vars(args), "drops": len(drops), **results, "dynamic_over_growing": ratio}
    print(f"{len(drops)} drops of a batch of {args.rows} rows, {args.layers} layers")
    for kind in ("dynamic", "growing"):
        r = results[kind]
        print(f"  {kind:8s} {r['seconds']:8.3f} s  {r['gib_moved']:8.2f} GiB moved")
    print(f"  transformers' dynamic layer / the judge's growing layer: {ratio:.1f}x")
    OUT.mkdir(exist_ok=True)
    path = OUT / f"row_drops-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
