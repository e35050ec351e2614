"""Scaling out on Ray, side by side in one run: one Serve replica against two, and Ray Data
labeling with one actor against two, on a local two-node cluster (`ray.cluster_utils.Cluster`)
against a judge that answers every request after `--latency` seconds.

    python bench/ray_scale.py [--latency 0.3] [--concurrency 4] [--traces 200] [--out FILE]

The judge is the tests' OpenAI-compatible server in a process of its own; NLI is replayed. Each
replica or actor holds one checker whose judge keeps `--concurrency` requests in flight, so one
checker's throughput is bounded by the judge's latency, as it is against a remote API with a
rate limit per worker. Each replica or actor takes one `node_slot` (one per node).

- reward: `--clients` clients post two rollouts each to `/reward`, back to back, for
  `--seconds`; rollouts scored per second;
- labeling: `label_traces` over `--traces` traces (the ten examples, repeated under new ids) on a
  `RayChecker`; steps per second over the whole run (actor start included) and between the first
  and the last verdict (steady state).

Every reward is compared with the one the stored verdicts give. Prints the ratios of two to one
and writes JSON (`bench/results/ray_scale.json` by default).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def start_judge(latency: float) -> tuple[Any, str]:
    from stepgap.segment import iter_traces
    from tests.fixtures.openai_server import example_prompt_keys, start_in_child, stored_answers

    traces = list(iter_traces(REPO / "examples" / "traces.jsonl"))
    answers = stored_answers(example_prompt_keys(traces), REPO / "examples" / "judge_replay.jsonl")
    return start_in_child(answers, latency)


def expected_rewards() -> dict[str, float]:
    from stepgap.reward_arithmetic import compute_reward
    from stepgap.segment import iter_traces
    from stepgap.teacher import Checker, ReplayJudge, ReplayNLI

    traces = list(iter_traces(REPO / "examples" / "traces.jsonl"))
    checker = Checker(
        ReplayJudge.from_file(REPO / "examples" / "judge_replay.jsonl"),
        ReplayNLI.from_file(REPO / "examples" / "nli_replay.jsonl"),
    )
    return {t.response: compute_reward(t, vs).reward for t, vs in zip(traces, checker.check(traces), strict=True)}  # fmt: skip


def reward_run(config, replicas: int, port: int, clients: int, seconds: float) -> dict:
    import httpx
    from ray import serve

    from stepgap.segment import iter_traces
    from stepgap.serving.ray_serve import deployment

    traces = list(iter_traces(REPO / "examples" / "traces.jsonl"))
    expected = expected_rewards()
    app = deployment(config, num_replicas=replicas,
                     ray_actor_options={"num_cpus": 0.5, "resources": {"node_slot": 1}})  # fmt: skip
    serve.run(app, name="stepgap", route_prefix="/")
    url = f"http://127.0.0.1:{port}/reward"
    scored, wrong, errors = [0], [0], [0]
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(k: int) -> None:
        with httpx.Client(timeout=120) as http:
            i = k
            while time.monotonic() < stop:
                pair = [traces[i % len(traces)], traces[(i + 1) % len(traces)]]
                i += 2
                body = {"responses": [t.response for t in pair],
                        "questions": [t.question for t in pair],
                        "golden_answers": [t.golden_answers for t in pair]}  # fmt: skip
                try:
                    got = http.post(url, json=body).json()["rewards"]
                except Exception:
                    with lock:
                        errors[0] += 1
                    continue
                with lock:
                    scored[0] += len(got)
                    wrong[0] += sum(
                        abs(r - expected[t.response]) > 1e-9 for r, t in zip(got, pair, strict=True)
                    )

    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    took = time.monotonic() - start
    serve.delete("stepgap")
    return {
        "replicas": replicas,
        "rollouts": scored[0],
        "seconds": round(took, 2),
        "rollouts_per_s": round(scored[0] / took, 3),
        "wrong_rewards": wrong[0],
        "errors": errors[0],
    }


def label_run(config, actors: int, traces: list, batch_size: int) -> dict:
    from stepgap.teacher.label import label_traces
    from stepgap.teacher.ray_checker import RayChecker

    out = Path(tempfile.mkdtemp()) / "verdicts.jsonl"
    times: list[float] = []

    class Clocked(RayChecker):
        def check_stream(self, traces, **kw):  # the time each trace's verdicts came back
            for item in super().check_stream(traces, **kw):
                times.append(time.monotonic())
                yield item

    checker = Clocked(config, actors=actors, batch_size=batch_size, num_cpus=0.5)
    start = time.monotonic()
    summary = label_traces(traces, checker, out, progress=False)
    took = time.monotonic() - start
    steps = summary.verdicts
    steady = times[-1] - times[0] if len(times) > 1 else took
    return {
        "actors": actors,
        "steps": steps,
        "failed": summary.errors,
        "seconds": round(took, 2),
        "steps_per_s": round(steps / took, 3),
        "steady_steps_per_s": round(steps / steady, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.3, help="judge seconds per answer")
    parser.add_argument("--concurrency", type=int, default=4, help="judge requests per checker")
    parser.add_argument("--clients", type=int, default=16, help="reward clients")
    parser.add_argument("--seconds", type=float, default=30.0, help="reward run length")
    parser.add_argument("--traces", type=int, default=200, help="traces to label")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "ray_scale.json"))
    args = parser.parse_args()

    # first: it keeps the cluster, the driver and the judge on 127.0.0.1 (read at Ray's import)
    from tests.fixtures.ray_cluster import two_node_cluster  # isort: skip

    from ray import serve
    from ray.data import DataContext

    from stepgap.segment import iter_traces
    from stepgap.teacher import CheckerConfig
    from tests.fixtures.live_server import _free_port

    judge, base_url = start_judge(args.latency)
    config = CheckerConfig(
        judge="openai:gpt-4.1-mini",
        base_url=base_url,
        concurrency=args.concurrency,
        no_cache=True,
        nli=f"replay:{REPO / 'examples' / 'nli_replay.jsonl'}",
    )
    examples = list(iter_traces(REPO / "examples" / "traces.jsonl"))
    traces = [
        examples[i % len(examples)].model_copy(update={"id": f"copy{i}"})
        for i in range(args.traces)
    ]
    port = _free_port()
    try:
        with two_node_cluster():
            DataContext.get_current().enable_progress_bars = False
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            try:
                reward = [reward_run(config, n, port, args.clients, args.seconds) for n in (1, 2)]
                labeling = [label_run(config, n, traces, batch_size=8) for n in (1, 2)]
            finally:
                serve.shutdown()
    finally:
        judge.terminate()
    result = {
        "latency_s": args.latency,
        "judge_concurrency_per_checker": args.concurrency,
        "reward": reward,
        "reward_ratio": round(reward[1]["rollouts_per_s"] / reward[0]["rollouts_per_s"], 2),
        "labeling": labeling,
        "labeling_ratio": round(labeling[1]["steps_per_s"] / labeling[0]["steps_per_s"], 2),
        "labeling_steady_ratio": round(
            labeling[1]["steady_steps_per_s"] / labeling[0]["steady_steps_per_s"], 2
        ),
    }
    for r in reward:
        print(f"reward   {r['replicas']} replica(s): {r['rollouts_per_s']:7.2f} rollouts/s "
              f"({r['rollouts']} in {r['seconds']} s, {r['wrong_rewards']} wrong, "
              f"{r['errors']} errors)")  # fmt: skip
    print(f"reward   2 vs 1: {result['reward_ratio']}x (goal 1.8x)")
    for r in labeling:
        print(f"labeling {r['actors']} actor(s):   {r['steps_per_s']:7.2f} steps/s over the run, "
              f"{r['steady_steps_per_s']:.2f} steady ({r['steps']} steps in {r['seconds']} s, "
              f"{r['failed']} failed)")  # fmt: skip
    print(f"labeling 2 vs 1: {result['labeling_ratio']}x over the run, "
          f"{result['labeling_steady_ratio']}x steady (goal 1.8x)")  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
