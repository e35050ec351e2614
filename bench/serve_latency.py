"""`stepgap serve` as OpenRLHF's rollouts drive it, in three scenes, each server configuration
side by side in one run (every reward compared with the one of the stored verdicts):

    python bench/serve_latency.py [--scenes rate,slots,outage] [--baseline DIR] [--out bench/results]

- `rate`: `--clients` closed-loop clients (64), each posting one rollout to `/get_reward` and
  the next as soon as it is answered, for `--seconds`, against a judge that answers every
  request after `--latency` s and serves any number at once (a hosted API). Rewards per second
  and latency; runs `one_call` (`--max-inflight 1`: one checker call at a time) and `defaults`.
- `slots`: `--rollouts` distinct rollouts (the example traces under new ids, each with a golden
  answer alias of its own so that no two share a check; `--no-cache`, or with `--answer-cache`
  a fresh cache a run) sent at once through OpenRLHF 0.11's own client
  (`SingleTurnAgentExecutor`: one request per rollout, 5 tries 1 s apart, Retry-After
  ignored; its fixed 180 s scaled down to `--budget`, the server's
  `--client-timeout` too), against a judge server of `--slots` slots that says so at `/props`
  (as llama.cpp's does) and takes `--slot-latency` s a request (with `--shared-slots`, that
  alone: the slots share one compute, as llama-server's on a few CPU threads). Rewards
  delivered and `None`s, as the client sees them, 503s, the judge requests started, finished
  and cancelled part-way (the judge server saw their connection closed), and the share of the
  finished ones that reached a delivered reward. With `--judge-url` (a real engine, e.g.
  llama-server: `tools/llama_serve_check.sh`) and `--nli` (a model: a real judge writes quotes
  no replay file holds), the slots scene asks that engine instead; its rewards are then the
  engine's own, so they are counted, not compared; with `--engine-log` (llama-server's log
  file) the judge's requests are counted from what the engine logged during each run.
- `outage`: `--outage-rollouts` rollouts through OpenRLHF's client; the scripted judge is killed
  (SIGKILL) `--kill-after` s in and started again on its port `--down-for` s later. When
  `/health` says degraded, how fast the requests sent meanwhile are answered, the time from the
  restart to a fresh rollout's reward, and the first rollouts' rewards.

The slots and outage scenes run `defaults`, `no_keep` (`--keep-for-retry 0`) and, with
`--baseline DIR` (an earlier stepgap: `pip install --no-deps --target DIR PATH`), `today`: that
package's server with its defaults, side by side in one run; the outage scene also runs
`hold_if_down` (`--when-judge-down hold`).

The judge is the tests' OpenAI-compatible server in a process of its own; NLI is replayed; each
`stepgap serve` runs in its own process with `--max-batch 32` and `--concurrency 8`. Writes
`serve_latency.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RATE_RUNS = {"one_call": ["--max-inflight", "1"], "defaults": []}
# name: (flags, whether it runs the --baseline package); a baseline run is left out without one
SLOT_RUNS = {
    "today": ([], True),
    "no_keep": (["--keep-for-retry", "0"], False),
    "defaults": ([], False),
}
# the outage scene also holds requests while the judge is down (OpenRLHF's tries then outlast it)
OUTAGE_RUNS = {**SLOT_RUNS, "hold_if_down": (["--when-judge-down", "hold"], False)}


def start_server(
    base_url: str,
    nli: Path | str,
    extra: list[str],
    baseline: str | None = None,
    cache: Path | None = None,
) -> tuple[subprocess.Popen, str, Path]:
    """`stepgap serve` in a process of its own; `baseline`: a folder holding an earlier
    stepgap (`pip install --no-deps --target DIR`), which it then runs instead of this one;
    `cache`: a fresh answer cache file for this server (else `--no-cache`)."""
    import httpx

    from tests.fixtures.live_server import _free_port

    env = {**os.environ, **({"PYTHONPATH": baseline} if baseline else {})}
    port = _free_port()
    log = Path(tempfile.mkdtemp()) / "serve.log"
    cmd = [
        sys.executable, "-m", "stepgap.cli", "serve", "--port", str(port),
        "--judge", "openai:gpt-4.1-mini", "--base-url", base_url,
        *(["--cache", str(cache)] if cache else ["--no-cache"]),
        "--nli", f"replay:{nli}" if str(nli).endswith(".jsonl") else str(nli),
        "--max-batch", "32", "--concurrency", "8", *extra,
    ]  # fmt: skip
    # a baseline runs from its folder: `python -m` puts the working directory first
    cwd = baseline or None
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=cwd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"stepgap serve exited at start: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError("stepgap serve did not start")


def _prompt(question: str) -> str:
    return f"<|im_start|>user\nQuestion: {question}<|im_end|>\n<|im_start|>assistant\n"


async def drive_rate(url: str, traces, expected: dict, clients: int, seconds: float):
    """`clients` closed-loop clients for `seconds`: latencies of answered requests, outcomes."""
    import httpx

    latencies: list[float] = []
    outcomes = {"answered": 0, "503": 0, "timeout": 0, "error": 0, "wrong": 0}
    stop = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=180.0, limits=limits) as http:

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


def drive_slots(url: str, rollouts, expected: dict | None, budget: float) -> dict:
    """Every rollout at once through OpenRLHF's own client, its timeout cut to `budget`;
    `expected` (trace id -> reward) checks each reward delivered, when the judge is scripted."""
    import aiohttp
    from openrlhf.utils import agent

    real = aiohttp.ClientTimeout
    agent.aiohttp.ClientTimeout = lambda total=None, **_: real(total=budget)  # type: ignore[assignment]
    client = agent.SingleTurnAgentExecutor(f"{url}/get_reward")

    async def one(t) -> float | None:
        prompt = _prompt(t.question)
        try:
            (answer,) = await client._fetch_rewards_via_http(
                [prompt + t.response], [prompt], [t.golden_answers]
            )
        except RuntimeError:  # 5 tries failed: OpenRLHF gives this rollout no reward
            return None
        return answer["rewards"][0]

    async def run() -> list[float | None]:
        return await asyncio.gather(*(one(t) for t in rollouts))

    started = time.monotonic()
    try:
        got = asyncio.run(run())
    finally:
        agent.aiohttp.ClientTimeout = real  # type: ignore[assignment]
    wall = time.monotonic() - started
    delivered = [(t, r) for t, r in zip(rollouts, got, strict=True) if r is not None]
    return {
        "rollouts": len(rollouts),
        "rewards": len(delivered),
        "none": len(rollouts) - len(delivered),
        "wrong": None
        if expected is None
        else sum(abs(r - expected[t.id.split("#")[0]]) > 1e-9 for t, r in delivered),
        "wall_s": round(wall, 1),
        "delivered_steps": sum(len(t.steps or []) for t, _ in delivered),
    }


def _metric(url: str, name: str) -> float:
    import re

    import httpx

    text = httpx.get(f"{url}/metrics").text
    return sum(
        float(m) for m in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)", text, re.M)
    )


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rate_scene(args, traces, expected, answers, nli) -> dict:
    from tests.fixtures.openai_server import start_in_child

    judge, base_url = start_in_child(answers, args.latency)
    runs = {}
    try:
        for name, extra in RATE_RUNS.items():
            server, url, _ = start_server(base_url, nli, extra)
            try:
                latencies, outcomes, wall = asyncio.run(
                    drive_rate(url, traces, expected, args.clients, args.seconds)
                )
            finally:
                server.terminate()
                server.wait(timeout=60)
            runs[name] = {
                **outcomes,
                "wall_s": round(wall, 1),
                "rewards_per_s": round(outcomes["answered"] / wall, 2),
                "p50_s": round(_quantile(latencies, 0.5), 2),
                "p95_s": round(_quantile(latencies, 0.95), 2),
                "max_s": round(max(latencies, default=float("nan")), 2),
            }
            print(f"rate {name}: {runs[name]}", flush=True)
    finally:
        judge.terminate()
    base = runs["one_call"]["rewards_per_s"]
    for r in runs.values():
        r["x_one_call"] = round(r["rewards_per_s"] / base, 2) if base else None
    return runs


def distinct_rollouts(traces, n: int, tag: str = "") -> list:
    """`n` rollouts, each its own: the example traces under new ids, each with a golden answer
    alias of its own that matches nothing (the judge's prompts, and so the scripted judge's
    answers and the rewards, stay the traces')."""
    out = []
    for i in range(n):
        t = traces[i % len(traces)]
        alias = f"unmatched alias {tag}{i}"
        out.append(t.model_copy(update={"id": f"{t.id}#{tag}{i}",
                                        "golden_answers": [*t.golden_answers, alias]}))  # fmt: skip
    return out


def runs_to_make(args, table: dict = SLOT_RUNS) -> dict[str, tuple[list[str], str | None]]:
    """A scene's runs (`SLOT_RUNS`, `OUTAGE_RUNS`): name -> (flags, baseline folder or None)."""
    wanted = args.runs.split(",") if args.runs else list(table)
    if unknown := set(wanted) - set(table):
        sys.exit(f"--runs: no run {sorted(unknown)} in this scene; it has {list(table)}")
    runs = {}
    for name, (flags, old) in table.items():
        if name not in wanted or (old and not args.baseline):
            continue
        runs[name] = (flags, args.baseline if old else None)
    return runs


def finished_used(delivered_steps: int, finished: int) -> float | None:
    """The share of the judge's finished requests that reached a delivered reward."""
    return round(min(1.0, delivered_steps / finished), 2) if finished else None


def judge_seen(report: Path, delivered_steps: int) -> dict:
    """What the scripted judge server saw: requests started, finished (answered), cancelled
    part-way, and the share of finished ones that reached a delivered reward."""
    time.sleep(1.0)  # the judge server's last report
    seen = json.loads(report.read_text())
    return {
        "judge_started": seen["requests"],
        "judge_finished": seen["answered"],
        "judge_cancelled": seen["cancelled"],
        "judge_max_open": seen["max_open"],
        "finished_used": finished_used(delivered_steps, seen["answered"]),
    }


# llama-server's log lines of a request: a slot takes it, the server cancels it, the slot lets go
LLAMA_TASK = re.compile(
    r"task (\d+) \| (processing task|stop processing)|cancel task, id_task = (\d+)"
)


def engine_seen(log: Path, offset: int, delivered_steps: int) -> dict:
    """What llama-server logged of one run's requests, from byte `offset` of its log on: started
    when a slot takes one, cancelled part-way when the server cancels it while a slot works on
    it (`judge_cancelled_queued`: before a slot took it), finished when a slot lets go of it
    uncancelled; and the share of the finished ones that reached a delivered reward."""
    time.sleep(1.0)  # the engine's last lines, as the judge server's last report
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    working: set[str] = set()
    cut: set[str] = set()
    started = finished = cancelled = queued = 0
    for task, event, cancel in LLAMA_TASK.findall(text):
        if cancel:
            if cancel in working:
                cut.add(cancel)
            else:
                queued += 1
        elif event == "processing task":
            working.add(task)
            started += 1
        elif task in working:
            working.discard(task)
            if task in cut:
                cancelled += 1
            else:
                finished += 1
    return {
        "judge_started": started,
        "judge_finished": finished,
        "judge_cancelled": cancelled,
        "judge_cancelled_queued": queued,
        "finished_used": finished_used(delivered_steps, finished),
    }


def slots_scene(args, traces, expected, answers, nli) -> dict:
    from tests.fixtures.openai_server import start_in_child

    rollouts = distinct_rollouts(traces, args.rollouts)
    runs = {}
    for name, (extra, baseline) in runs_to_make(args).items():
        report = Path(tempfile.mkdtemp()) / "judge.json"
        judge, base_url = None, args.judge_url
        if base_url is None:
            judge, base_url = start_in_child(
                answers, args.slot_latency, slots=args.slots, props=True, answer_any=True,
                report=str(report), shared=args.shared_slots,
            )  # fmt: skip
        offset = Path(args.engine_log).stat().st_size if args.engine_log else 0
        try:
            cache = Path(tempfile.mkdtemp()) / "answers.sqlite" if args.answer_cache else None
            server, url, log = start_server(
                base_url, nli, [*extra, "--client-timeout", str(args.budget)], baseline, cache
            )
            try:
                run = drive_slots(url, rollouts, None if judge is None else expected, args.budget)
                run["503s"] = int(_metric(url, "stepgap_rejected_total"))
                run["failed_traces"] = int(_metric(url, "stepgap_traces_failed_total"))
            finally:
                server.terminate()
                server.wait(timeout=60)
            if judge is not None:
                run.update(judge_seen(report, run.pop("delivered_steps")))
            elif args.engine_log:
                run.update(engine_seen(Path(args.engine_log), offset, run["delivered_steps"]))
            run["started"] = next(
                (line for line in log.read_text().splitlines() if "probe" in line), ""
            )
        finally:
            if judge is not None:
                judge.terminate()
        runs[name] = run
        print(f"slots {name}: {run}", flush=True)
    return runs


def _openrlhf_body(t) -> dict:
    prompt = _prompt(t.question)
    return {"query": [prompt + t.response], "prompts": [prompt], "labels": [t.golden_answers]}


def watch_outage(url: str, fresh: list, down_for: float, restart) -> dict:
    """After the judge was killed: when `/health` first says degraded, and how long each
    request sent while it is down takes to be answered (and with what), one every half second
    (each waits at most until the restart); then `restart()` and the time until a fresh
    rollout, retried as OpenRLHF's client does (1 s after a 503), gets its reward."""
    import threading

    import httpx

    killed = time.monotonic()
    degraded: list[float] = []

    def watch_health() -> None:  # every 50 ms, beside the requests
        while not degraded and time.monotonic() - killed < down_for:
            if httpx.get(f"{url}/health", timeout=5).json()["status"] == "degraded":
                degraded.append(time.monotonic() - killed)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch_health, daemon=True)
    watcher.start()
    while_down = []
    k = 0
    while (left := down_for - (time.monotonic() - killed)) > 0:
        sent = time.monotonic()
        try:
            r = httpx.post(f"{url}/get_reward", json=_openrlhf_body(fresh[k]), timeout=left)
            while_down.append((r.status_code, round(time.monotonic() - sent, 2)))
        except httpx.TimeoutException:
            while_down.append(("no answer", round(time.monotonic() - sent, 2)))
        k += 1
        time.sleep(0.5)
    watcher.join()
    restarted = restart()
    tries = 0
    while True:
        tries += 1
        r = httpx.post(f"{url}/get_reward", json=_openrlhf_body(fresh[k]), timeout=180)
        if r.status_code == 200 and r.json()["rewards"][0] is not None:
            break
        time.sleep(1.0)
    return {
        "degraded_after_s": round(degraded[0], 2) if degraded else None,
        "while_down": while_down,
        "first_reward_after_restart_s": round(time.monotonic() - restarted, 2),
        "tries_after_restart": tries,
    }


def outage_scene(args, traces, expected, answers, nli) -> dict:
    """`--outage-rollouts` rollouts through OpenRLHF's client; the judge server is killed
    (SIGKILL) `--kill-after` s in, and started again on its port `--down-for` s later."""
    runs = {}
    for name, (extra, baseline) in runs_to_make(args, OUTAGE_RUNS).items():
        runs[name] = outage_run(args, traces, answers, nli, name, extra, baseline)
        print(f"outage {name}: {runs[name]}", flush=True)
    return runs


def outage_run(args, traces, answers, nli, name: str, extra: list[str], baseline) -> dict:
    import threading

    from tests.fixtures.openai_server import start_in_child

    options = {"slots": args.slots, "props": True, "answer_any": True}
    judge, base_url = start_in_child(answers, args.slot_latency, **options)
    judges = [judge]  # the running one last
    port = int(base_url.rsplit(":", 1)[1].split("/")[0])
    server, url, _ = start_server(
        base_url, nli, [*extra, "--client-timeout", str(args.budget)], baseline
    )
    rollouts = distinct_rollouts(traces, args.outage_rollouts, tag=f"{name}-")
    fresh = distinct_rollouts(traces, 200, tag=f"{name}-fresh-")
    first: dict = {}
    driver = threading.Thread(
        target=lambda: first.update(drive_slots(url, rollouts, None, args.budget))
    )

    def restart() -> float:
        judges.append(start_in_child(answers, args.slot_latency, port=port, **options)[0])
        return time.monotonic()

    try:
        driver.start()
        time.sleep(args.kill_after)
        judge.kill()
        judge.join()
        run = watch_outage(url, fresh, args.down_for, restart)
        driver.join()
        run["first_rollouts"] = {k: first.get(k) for k in ("rollouts", "rewards", "none")}
    finally:
        server.terminate()
        server.wait(timeout=60)
        judges[-1].terminate()
    return run


def main() -> None:
    from stepgap.reward_arithmetic import compute_reward
    from stepgap.segment import iter_traces
    from stepgap.teacher import Checker, ReplayJudge, ReplayNLI
    from tests.fixtures.openai_server import example_prompt_keys, stored_answers

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenes", default="rate,slots")
    p.add_argument("--clients", type=int, default=64, help="rate: closed-loop clients")
    p.add_argument("--latency", type=float, default=0.3, help="rate: seconds per judge answer")
    p.add_argument("--seconds", type=float, default=40.0, help="rate: load per run")
    p.add_argument("--rollouts", type=int, default=40, help="slots: rollouts sent at once")
    p.add_argument("--slots", type=int, default=4, help="slots: the judge server's slots")
    p.add_argument("--slot-latency", type=float, default=2.0, help="slots: seconds a request")
    p.add_argument("--budget", type=float, default=30.0, help="slots: OpenRLHF's 180 s, scaled")
    p.add_argument("--judge-url", help="slots: a real engine's base URL instead of the fake")
    p.add_argument(
        "--answer-cache", action="store_true", help="slots: each run's server keeps its judge "
        "answers in a fresh cache of its own (a retry finds its answered steps), not --no-cache",
    )  # fmt: skip
    p.add_argument(
        "--engine-log", help="slots, with --judge-url: llama-server's log file, to count the "
        "judge's requests started, finished and cancelled in each run",
    )  # fmt: skip
    p.add_argument(
        "--baseline",
        help="slots, outage: a folder with an earlier stepgap to run "
        "beside this one ('today'), made by pip install --no-deps --target DIR",
    )
    p.add_argument(
        "--runs",
        help="slots, outage: the runs to make, comma-separated (default: all the scene has; a "
        "real engine's run takes up to 5 budgets)",
    )
    p.add_argument(
        "--shared-slots",
        action="store_true",
        help="slots: the slots share one "
        "compute, as llama-server's on a few CPU threads (a request beside 3 others "
        "takes 4x --slot-latency)",
    )
    p.add_argument("--outage-rollouts", type=int, default=10, help="outage: rollouts sent")
    p.add_argument("--kill-after", type=float, default=5.0, help="outage: seconds to the kill")
    p.add_argument("--down-for", type=float, default=10.0, help="outage: seconds down")
    p.add_argument("--nli", help="NLI spec (default: the examples' replay file)")
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
    os.environ.setdefault("OPENAI_API_KEY", "bench-not-a-real-key")
    nli = args.nli or ex / "nli_replay.jsonl"
    result: dict = {"bench": "serve_latency", "args": vars(args)}
    scenes = args.scenes.split(",")
    if "rate" in scenes:
        result["rate"] = rate_scene(args, traces, expected, answers, nli)
    if "slots" in scenes:
        result["slots"] = slots_scene(args, traces, expected, answers, nli)
    if "outage" in scenes:
        result["outage"] = outage_scene(args, traces, expected, answers, nli)

    if "rate" in result:
        print(f"\nrate: {args.clients} clients, {args.latency * 1000:.0f} ms per judge answer, "
              f"{args.seconds:g} s per run")  # fmt: skip
        print(f"{'run':10} {'rewards/s':>10} {'x one call':>11} {'p50 s':>7} {'p95 s':>7} "
              f"{'503s':>5} {'timeouts':>9} {'wrong':>6}")  # fmt: skip
        for name, r in result["rate"].items():
            print(f"{name:10} {r['rewards_per_s']:10.2f} {r['x_one_call']:11.2f} "
                  f"{r['p50_s']:7.2f} {r['p95_s']:7.2f} {r['503']:5d} {r['timeout']:9d} "
                  f"{r['wrong']:6d}")  # fmt: skip
    if "slots" in result:
        judge = (
            f"the engine at {args.judge_url}"
            if args.judge_url
            else f"a judge of {args.slots} slots at {args.slot_latency:g} s a request"
        )
        print(f"\nslots: {args.rollouts} distinct rollouts at once, OpenRLHF's client (budget "
              f"{args.budget:g} s), {judge}")  # fmt: skip
        columns = ("rewards", "none", "wall_s", "503s", "judge_started", "judge_finished",
                   "judge_cancelled", "finished_used", "wrong")  # fmt: skip
        print(f"{'run':10} " + " ".join(f"{c:>15}" for c in columns))
        for name, r in result["slots"].items():
            print(f"{name:10} " + " ".join(f"{str(r.get(c, '-')):>15}" for c in columns))
    if "outage" in result:
        print(
            f"\noutage: {args.outage_rollouts} rollouts, the judge killed {args.kill_after:g} s "
            f"in, started again {args.down_for:g} s later ({args.slot_latency:g} s a request)"
        )
        for name, r in result["outage"].items():
            slowest = max((s for _, s in r["while_down"]), default=None)
            print(f"{name:12} degraded after {r['degraded_after_s']} s; {len(r['while_down'])} "
                  f"requests while down, slowest answered in {slowest} s "
                  f"({sorted({str(c) for c, _ in r['while_down']})}); first reward "
                  f"{r['first_reward_after_restart_s']} s after the restart; first rollouts "
                  f"{r['first_rollouts']}")  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve_latency.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # tests.fixtures (the fake OpenAI-compatible server)
    main()
