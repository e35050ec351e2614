"""`stepgap serve` under a slow judge: rewards per second and latency of 64 concurrent OpenRLHF
clients, the server as it was before per-trace answers and deadlines against today's.

    python bench/serve_latency.py [--clients 64] [--latency 0.3] [--seconds 40]

The judge is the tests' OpenAI-compatible server answering every request after `--latency`
seconds (in its own process, as a remote API would), NLI is replayed, and each server runs in a
process of its own with the same flags (`--max-batch 32`, the judge's `--concurrency 8`). Each
client posts one rollout to `/get_reward` (OpenRLHF's protocol, one query per request as its
rollouts send them), waits for the answer (at most the client budget, OpenRLHF's 180 s), and
posts the next, for `--seconds`. Runs:

- `before`: `serving/server.py` as of commit BEFORE (read with `git show`, so the bench needs a
  clone): one checker call at a time, each batch answered when its slowest trace is in;
- `before_c64`: the same with the judge's `--concurrency 64`, as many judge requests in flight
  as `today` keeps: what the old loop does with the same budget of requests;
- `inflight_1`: today's server with `--max-inflight 1`: traces answered as they finish;
- `today`: today's server with its defaults (8 calls in flight for a judge behind a URL).

Prints rewards/s, p50/p95/max latency, 503s and client timeouts, and each run's ratio to
`before`; every reward is compared with the one of the stored verdicts. Writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEFORE = "1309df6"  # the last commit whose server checked one batch at a time


def load_server_before(commit: str = BEFORE):
    """`stepgap.serving.server` as it was at `commit` (its relative imports resolve to today's
    sibling modules, whose interfaces it uses are unchanged)."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{commit}:serving/server.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "server_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("stepgap.serving.server_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def serve_before(argv: list[str]) -> None:
    """Run the old server on `stepgap serve`'s own arguments (the reward is built as today)."""
    import uvicorn

    from stepgap.cli import build_parser
    from stepgap.cli.options import checker
    from stepgap.serving import StepGapReward

    args = build_parser().parse_args(["serve", *argv])
    old = load_server_before()
    app = old.create_app(
        StepGapReward(checker(args), args.variant, args.lam),
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


def start_server(
    kind: str, base_url: str, nli: Path, extra: list[str]
) -> tuple[subprocess.Popen, str]:
    import httpx

    from tests.fixtures.live_server import _free_port

    port = _free_port()
    flags = [
        "--port", str(port), "--judge", "openai:gpt-4.1-mini", "--base-url", base_url,
        "--no-cache", "--nli", f"replay:{nli}", "--max-batch", "32", "--concurrency", "8", *extra,
    ]  # fmt: skip
    if kind == "before":
        cmd = [sys.executable, __file__, "--serve-before", *flags]
    else:
        cmd = [sys.executable, "-m", "stepgap.cli", "serve", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the {kind} server exited at start: {' '.join(cmd)}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError(f"the {kind} server did not start")


def _prompt(question: str) -> str:
    return f"<|im_start|>user\nQuestion: {question}<|im_end|>\n<|im_start|>assistant\n"


async def drive(url: str, traces, expected: dict, clients: int, seconds: float, budget: float):
    """`clients` closed-loop clients for `seconds`; returns latencies of answered requests and
    counts of the other outcomes."""
    import httpx

    latencies: list[float] = []
    outcomes = {"answered": 0, "503": 0, "timeout": 0, "error": 0, "wrong": 0}
    stop = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=budget, limits=limits) as http:

        async def client(k: int) -> None:
            n = 0
            while time.monotonic() < stop:
                t = traces[(k + n) % len(traces)]
                n += 1
                body = {
                    "query": [_prompt(t.question) + t.response],
                    "prompts": [_prompt(t.question)],
                    "labels": [t.golden_answers],
                }
                start = time.monotonic()
                try:
                    r = await http.post(f"{url}/get_reward", json=body)
                except httpx.TimeoutException:
                    outcomes["timeout"] += 1
                    continue
                except httpx.HTTPError:
                    outcomes["error"] += 1
                    await asyncio.sleep(1)
                    continue
                if r.status_code == 503:  # as OpenRLHF's client: 1 s, then again
                    outcomes["503"] += 1
                    await asyncio.sleep(1)
                    continue
                if r.status_code != 200:
                    outcomes["error"] += 1
                    continue
                if abs(r.json()["rewards"][0] - expected[t.id]) > 1e-9:
                    outcomes["wrong"] += 1
                latencies.append(time.monotonic() - start)
                outcomes["answered"] += 1

        started = time.monotonic()
        await asyncio.gather(*(client(k) for k in range(clients)))
        wall = time.monotonic() - started
    return latencies, outcomes, wall


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:

    from stepgap.data_builders import iter_traces
    from stepgap.serving import compute_reward
    from stepgap.teacher import Checker, ReplayJudge, ReplayNLI
    from tests.fixtures.openai_server import example_prompt_keys, start_in_child, stored_answers

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--latency", type=float, default=0.3, help="seconds per judge answer")
    p.add_argument("--seconds", type=float, default=40.0, help="load per run")
    p.add_argument("--budget", type=float, default=180.0, help="a client's timeout (OpenRLHF's)")
    p.add_argument("--runs", default="before,before_c64,inflight_1,today")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args()

    ex = REPO / "examples"
    traces = list(iter_traces(ex / "traces.jsonl"))
    replay = Checker(
        ReplayJudge.from_file(ex / "judge_replay.jsonl"),
        ReplayNLI.from_file(ex / "nli_replay.jsonl"),
    )
    expected = {
        t.id: compute_reward(t, vs).reward
        for t, vs in zip(traces, replay.check(traces), strict=True)
    }
    answers = stored_answers(example_prompt_keys(traces), ex / "judge_replay.jsonl")
    judge, base_url = start_in_child(answers, args.latency)
    os.environ.setdefault("OPENAI_API_KEY", "bench-not-a-real-key")
    # the same flags for all; `before_c64` gives the old server as many judge requests in
    # flight as today's default keeps (8 calls x --concurrency 8)
    extra = {"before": [], "before_c64": ["--concurrency", "64"],
             "inflight_1": ["--max-inflight", "1"], "today": []}  # fmt: skip
    runs: dict[str, dict] = {}
    try:
        for name in args.runs.split(","):
            server, url = start_server(
                "before" if name.startswith("before") else "today", base_url,
                ex / "nli_replay.jsonl", extra[name],
            )  # fmt: skip
            try:
                latencies, outcomes, wall = asyncio.run(
                    drive(url, traces, expected, args.clients, args.seconds, args.budget)
                )
            finally:
                server.terminate()
                server.wait(timeout=60)
            runs[name] = {
                **outcomes,
                "wall_s": wall,
                "rewards_per_s": outcomes["answered"] / wall,
                "p50_s": _quantile(latencies, 0.5),
                "p95_s": _quantile(latencies, 0.95),
                "max_s": max(latencies, default=float("nan")),
            }
            print(f"{name}: {runs[name]}", flush=True)
    finally:
        judge.terminate()
    base = runs.get("before", {}).get("rewards_per_s")
    print(
        f"\n{args.clients} clients, {args.latency * 1000:.0f} ms per judge answer, "
        f"{args.seconds:g} s per run, client budget {args.budget:g} s"
    )
    print(
        f"{'run':12} {'rewards/s':>10} {'x before':>9} {'p50 s':>7} {'p95 s':>7} {'max s':>7} "
        f"{'503s':>5} {'timeouts':>9} {'wrong':>6}"
    )
    for name, r in runs.items():
        ratio = r["rewards_per_s"] / base if base else float("nan")
        print(
            f"{name:12} {r['rewards_per_s']:10.2f} {ratio:9.2f} {r['p50_s']:7.2f} "
            f"{r['p95_s']:7.2f} {r['max_s']:7.2f} {r['503']:5d} {r['timeout']:9d} {r['wrong']:6d}"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"bench": "serve_latency", "clients": args.clients, "latency_s": args.latency,
              "seconds": args.seconds, "budget_s": args.budget, "before_commit": BEFORE,
              "runs": runs}  # fmt: skip
    (out / "serve_latency.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # tests.fixtures (the fake OpenAI-compatible server)
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-before":
        serve_before(sys.argv[2:])
    else:
        main()
