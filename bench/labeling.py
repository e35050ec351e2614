"""Teacher labeling steps/s against a local OpenAI-compatible server with 300 ms latency:
sequential vs `--concurrency 32`, the old batch-barrier loop vs today's streaming one, and a
fully cached rerun.

    python bench/labeling.py [--copies 10] [--latency 0.3] [--concurrency 32] [--mode both]

The example traces are copied under new ids (`--copies`), the fake server of the tests answers
each judge prompt after `--latency` seconds (in its own process, as a remote API would: its
CPU work does not compete with the client's), NLI is replayed, and `stepgap label` runs in
process exactly as a user runs it (`streaming`). `barrier` reproduces the loop `stepgap label`
ran before 2026-11-23: `Checker.check` on one batch of `--batch-size` traces at a time, so every
batch waited for its slowest answer before the next one was asked. Prints steps/s for each run
and the ratios to the sequential run; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def barrier_label(
    traces: Path, out: Path, base_url: str, nli: Path, concurrency: int, batch_size: int
) -> None:
    """The old `stepgap label` loop (no resume needed on a fresh file): judge a batch of traces,
    wait for all of its answers, decide it, write it, then ask for the next batch."""
    from stepgap.io import JsonlWriter
    from stepgap.segment import iter_traces
    from stepgap.teacher import build_checker

    checker = build_checker(
        judge="openai:gpt-4.1-mini",
        nli=f"replay:{nli}",
        judge_options={"base_url": base_url, "concurrency": concurrency, "no_cache": True},
    )
    pending = list(iter_traces(traces))
    with JsonlWriter(out) as writer:
        for start in range(0, len(pending), batch_size):
            for verdicts in checker.check(pending[start : start + batch_size]):
                for v in verdicts:
                    writer.write(v)


def main() -> None:

    from stepgap.cli import main as stepgap
    from stepgap.segment import iter_traces
    from tests.fixtures.openai_server import example_prompt_keys, start_in_child, stored_answers

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--copies", type=int, default=10)
    p.add_argument("--latency", type=float, default=0.3)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=64, help="stepgap label --batch-size")
    p.add_argument(
        "--mode",
        choices=["both", "barrier", "streaming"],
        default="both",
        help="the concurrent runs to time: the old batch-barrier loop, streaming, or both",
    )
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args()
    ex = REPO / "examples"
    traces = list(iter_traces(ex / "traces.jsonl"))
    answers = stored_answers(example_prompt_keys(traces), ex / "judge_replay.jsonl")
    server, base_url = start_in_child(answers, args.latency)
    os.environ.setdefault("OPENAI_API_KEY", "bench-not-a-real-key")
    runs: dict[str, dict[str, float]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            raw = [json.loads(x) for x in (ex / "traces.jsonl").read_text().splitlines()]
            with (tmp / "traces.jsonl").open("w") as f:
                for k in range(args.copies):
                    for rec in raw:
                        f.write(json.dumps({**rec, "id": f"{rec['id']}#{k}"}) + "\n")
            steps = sum(len(t.steps or []) for t in traces) * args.copies

            def timed(name: str, run) -> None:
                out = tmp / f"{name}.jsonl"
                start, cpu = time.perf_counter(), time.process_time()
                rc = run(out)
                seconds = time.perf_counter() - start
                cpu = time.process_time() - cpu  # this process, all threads: the client's work
                labeled = sum(
                    json.loads(x)["label"] is not None for x in out.read_text().splitlines()
                )
                assert rc in (0, None) and labeled == steps, (name, rc, labeled, steps)
                runs[name] = {"seconds": seconds, "cpu_s": cpu, "steps_per_s": steps / seconds}

            def label(name: str, concurrency: int, *cache_args: str) -> None:
                timed(name, lambda out: stepgap(
                    [
                        "label", str(tmp / "traces.jsonl"), "-o", str(out),
                        "--judge", "openai:gpt-4.1-mini", "--base-url", base_url,
                        "--nli", f"replay:{ex / 'nli_replay.jsonl'}", "--no-progress",
                        "--concurrency", str(concurrency), "--batch-size", str(args.batch_size), *cache_args,
                    ]
                ))  # fmt: skip

            c = args.concurrency
            label("sequential", 1, "--no-cache")
            if args.mode in ("both", "barrier"):
                timed(f"barrier_c{c}", lambda out: barrier_label(
                    tmp / "traces.jsonl", out, base_url, ex / "nli_replay.jsonl", c, args.batch_size
                ))  # fmt: skip
            if args.mode in ("both", "streaming"):
                label(f"streaming_c{c}", c, "--no-cache")
            if args.mode == "both":  # the same verdicts, in finishing order
                lines = [sorted((tmp / f"{n}_c{c}.jsonl").read_text().splitlines())
                         for n in ("barrier", "streaming")]  # fmt: skip
                assert lines[0] == lines[1], "streaming wrote other verdicts than the barrier loop"
            cache = str(tmp / "cache.sqlite")
            label("cache_fill", c, "--cache", cache)
            label("cached_rerun", c, "--cache", cache)
    finally:
        server.terminate()
    base = runs["sequential"]["steps_per_s"]
    print(
        f"{steps} steps, {args.latency * 1000:.0f} ms per judge answer, "
        f"--batch-size {args.batch_size}"
    )
    print(f"{'run':18} {'seconds':>8} {'client cpu s':>13} {'steps/s':>9} {'x sequential':>13}")
    for name, r in runs.items():
        print(
            f"{name:18} {r['seconds']:8.2f} {r['cpu_s']:13.2f} {r['steps_per_s']:9.1f} "
            f"{r['steps_per_s'] / base:13.1f}"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"bench": "labeling", "steps": steps, "latency_s": args.latency,
              "concurrency": args.concurrency, "batch_size": args.batch_size, "runs": runs,
              "ratio_to_sequential": {k: r["steps_per_s"] / base for k, r in runs.items()}}  # fmt: skip
    (out / "labeling.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # tests.fixtures (the fake OpenAI-compatible server)
    main()
