"""Teacher labeling steps/s against a local OpenAI-compatible server with 300 ms latency:
sequential vs `--concurrency 32`, and a fully cached rerun.

    python bench/labeling.py [--copies 10] [--latency 0.3] [--concurrency 32]

The example traces are copied under new ids (`--copies`), the fake server of the tests answers
each judge prompt after `--latency` seconds (in its own process, as a remote API would: its
CPU work does not compete with the client's), NLI is replayed, and `stepgap label` runs in
process exactly as a user runs it. Prints steps/s for each run and the ratios; writes JSON.
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


def _serve(answers: dict, latency: float, urls) -> None:
    """The fake OpenAI-compatible server, run in a child process until it is terminated."""
    import threading

    from tests.fixtures.openai_server import FakeOpenAI

    urls.put(FakeOpenAI(answers=answers, latency=latency).start().base_url)
    threading.Event().wait()


def main() -> None:
    import multiprocessing

    from stepgap.cli import main as stepgap
    from stepgap.data_builders import iter_traces
    from tests.fixtures.openai_server import example_prompt_keys, stored_answers

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--copies", type=int, default=10)
    p.add_argument("--latency", type=float, default=0.3)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=64, help="stepgap label --batch-size")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args()
    ex = REPO / "examples"
    traces = list(iter_traces(ex / "traces.jsonl"))
    answers = stored_answers(example_prompt_keys(traces), ex / "judge_replay.jsonl")
    urls = multiprocessing.Queue()
    server = multiprocessing.Process(target=_serve, args=(answers, args.latency, urls), daemon=True)
    server.start()
    base_url = urls.get(timeout=60)
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

            def label(name: str, concurrency: int, *cache_args: str) -> None:
                out = tmp / f"{name}.jsonl"
                start = time.perf_counter()
                rc = stepgap(
                    [
                        "label", str(tmp / "traces.jsonl"), "-o", str(out),
                        "--judge", "openai:gpt-4.1-mini", "--base-url", base_url,
                        "--nli", f"replay:{ex / 'nli_replay.jsonl'}", "--no-progress",
                        "--concurrency", str(concurrency), "--batch-size", str(args.batch_size), *cache_args,
                    ]
                )  # fmt: skip
                seconds = time.perf_counter() - start
                labeled = sum(
                    json.loads(x)["label"] is not None for x in out.read_text().splitlines()
                )
                assert rc == 0 and labeled == steps, (name, rc, labeled, steps)
                runs[name] = {"seconds": seconds, "steps_per_s": steps / seconds}

            label("sequential", 1, "--no-cache")
            label(f"concurrency_{args.concurrency}", args.concurrency, "--no-cache")
            cache = str(tmp / "cache.sqlite")
            label("cache_fill", args.concurrency, "--cache", cache)
            label("cached_rerun", args.concurrency, "--cache", cache)
    finally:
        server.terminate()
    base = runs["sequential"]["steps_per_s"]
    print(f"{steps} steps, {args.latency * 1000:.0f} ms per judge answer")
    print(f"{'run':18} {'seconds':>8} {'steps/s':>9} {'x sequential':>13}")
    for name, r in runs.items():
        print(
            f"{name:18} {r['seconds']:8.2f} {r['steps_per_s']:9.1f} {r['steps_per_s'] / base:13.1f}"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"bench": "labeling", "steps": steps, "latency_s": args.latency, "runs": runs,
              "ratio_to_sequential": {k: r["steps_per_s"] / base for k, r in runs.items()}}  # fmt: skip
    (out / "labeling.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # tests.fixtures (the fake OpenAI-compatible server)
    main()
