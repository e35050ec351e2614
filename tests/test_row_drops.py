"""bench/row_drops.py: one batch's row drops, timed on transformers' DynamicLayer and on the
judge's GrowingLayer over the same schedule."""

from __future__ import annotations

import argparse

from tests.fixtures.bench import bench_script


def test_the_drops_follow_the_loop_and_the_growing_layer_moves_only_rows_past_the_end():
    bench = bench_script("row_drops")
    drops = bench.schedule(rows=12, answer=9, seed=3)
    sizes = [len(keep) for _, keep in drops]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] >= 1  # the batch only shrinks
    steps = [step for step, _ in drops]
    assert steps == sorted(set(steps))  # one drop a step
    args = argparse.Namespace(
        rows=12, layers=2, kv_heads=1, head_dim=4, prompt=8, answer=9, dtype="float32", device="cpu"
    )
    dynamic, growing = bench.run("dynamic", args, drops), bench.run("growing", args, drops)
    assert 0 < growing["bytes_moved"] < dynamic["bytes_moved"]
