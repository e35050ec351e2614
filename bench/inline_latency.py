"""Time from a rollout's end to its reward: steps checked as their evidence arrives (inline,
`serving.streaming.StreamingReward`) against the whole trace checked after it ends (post-hoc,
`StepGapReward.score_traces`), side by side in one run.

    python bench/inline_latency.py [--rollouts 64] [--turn-s 2] [--judge-ms 300] [--slots 16]

`--rollouts` rollouts start together, as a GRPO step's do. Each replays one of the example
traces (3-4 turns: a step per search, then the answer), cycled under distinct ids: every turn
takes `--turn-s` seconds to generate, then the search result comes back and the step is
complete. The judge is an engine of `--slots` slots that answers each step after
`--judge-ms` ms (the stored answers of the example steps, so the labels and rewards are the real
ones), asked with the concurrency a server-backed judge gets (8 calls in flight); the NLI
answers are the stored ones. Three modes:
- `post_hoc_batch`: the rewards of the whole batch once its last rollout has ended, every step
  checked then (TRL's GRPOTrainer and veRL's reward managers score a generated batch);
- `post_hoc_each`: each rollout's reward asked when it ends, every step of it checked then (a
  reward per sample, as veRL's async reward loop asks);
- `inline`: each completed step submitted as the rollout goes on; the end asks only for the
  answer step and takes the other answers already made.

Prints, for each mode, the seconds from a rollout's end to its reward (mean, median, p95, max),
the ratio of the means, and whether the rewards are equal; writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

from stepgap.teacher.judges.base import JudgeBackend

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


class EngineJudge(JudgeBackend):
    """An engine of `slots` slots answering each step after `seconds`: the stored answer of the
    example step the request's trace replays (its id is `example#k`)."""

    name = "engine"
    concurrency = 16
    base_url = "http://127.0.0.1"  # a judge behind a server: calls in flight overlap

    def __init__(self, replay, slots: int, seconds: float) -> None:
        self.replay = replay
        self.slots = threading.Semaphore(slots)
        self.seconds = seconds
        self.pool = ThreadPoolExecutor(256)
        self.asked = 0
        self.lock = threading.Lock()

    def _one(self, request):
        with self.slots:
            time.sleep(self.seconds)
        with self.lock:
            self.asked += 1
        original = request.trace_id.rsplit("#", 1)[0]
        return self.replay.table[(original, request.step)]

    def judge(self, requests, *, stop=None):
        return list(self.pool.map(self._one, requests))


def engine_args(p: argparse.ArgumentParser) -> None:
    """The flags of a bench of rollouts that replay the example traces against `EngineJudge`."""
    p.add_argument("--rollouts", type=int, default=64)
    p.add_argument("--turn-s", type=float, default=2.0, help="generation time of one turn")
    p.add_argument("--judge-ms", type=float, default=300.0, help="the judge's time per step")
    p.add_argument("--slots", type=int, default=16, help="steps the judge engine serves at once")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))


def replayed(examples: list, count: int) -> list:
    """`count` rollouts replaying `examples` in turn, each under its own id (`example#k`)."""
    return [examples[k % len(examples)].model_copy(update={"id": f"{examples[k % len(examples)].id}#{k}"})
            for k in range(count)]  # fmt: skip


def report_head(name: str, args: argparse.Namespace, rollouts: int) -> dict:
    """What every such report starts with: the bench, the day, the machine, the command, and
    the workload of `engine_args`."""
    return {"bench": name, "date": date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "command": " ".join([Path(sys.executable).name, *sys.argv]), "rollouts": rollouts,
            "turn_s": args.turn_s, "judge_ms": args.judge_ms, "slots": args.slots}  # fmt: skip


def write_report(report: dict, out: str, name: str) -> None:
    """The report as JSON in `out` (bench/results by default)."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    engine_args(p)
    args = p.parse_args()

    from stepgap.segment import iter_traces
    from stepgap.serving.reward_function import StepGapReward
    from stepgap.serving.streaming import StreamingReward
    from stepgap.teacher.checker import Checker
    from stepgap.teacher.judges.replay import ReplayJudge
    from stepgap.teacher.nli.replay import ReplayNLI

    examples = [t for t in iter_traces(EXAMPLES / "traces.jsonl") if len(t.steps or []) >= 2]
    rollouts = replayed(examples, args.rollouts)
    replay = ReplayJudge.from_file(EXAMPLES / "judge_replay.jsonl")
    nli = ReplayNLI.from_file(EXAMPLES / "nli_replay.jsonl")

    def run(mode: str) -> dict:
        judge = EngineJudge(replay, args.slots, args.judge_ms / 1000)
        reward = StepGapReward(Checker(judge, nli))
        stream = StreamingReward(reward) if mode == "inline" else None
        waits: dict[str, float] = {}
        rewards: dict[str, float] = {}

        ends: dict[str, float] = {}
        done: dict[str, float] = {}

        def rollout(trace) -> None:
            for step in trace.steps[:-1]:  # a turn, then its search result: a complete step
                time.sleep(args.turn_s)
                if stream is not None:
                    stream.submit(trace.id, trace.question, step)
            time.sleep(args.turn_s)  # the answer turn: the rollout ends
            ends[trace.id] = ended = time.perf_counter()
            if mode == "post_hoc_batch":
                return
            if stream is not None:
                result = stream.finalize(trace)
            else:
                (result,) = reward.score_traces([trace])
            done[trace.id] = time.perf_counter()
            waits[trace.id] = done[trace.id] - ended
            rewards[trace.id] = result.reward

        start = time.perf_counter()
        with ThreadPoolExecutor(len(rollouts)) as pool:
            list(pool.map(rollout, rollouts))
        if mode == "post_hoc_batch":
            results = reward.score_traces(rollouts)
            for t, result in zip(rollouts, results, strict=True):
                done[t.id] = time.perf_counter()
                waits[t.id] = done[t.id] - ends[t.id]
                rewards[t.id] = result.reward
        if stream is not None:
            stream.close()
        w = list(waits.values())
        out = {
            "seconds_total": round(time.perf_counter() - start, 2),
            "end_to_reward_s": {
                "mean": round(statistics.mean(w), 3),
                "median": round(statistics.median(w), 3),
                "p95": round(percentile(w, 0.95), 3),
                "max": round(max(w), 3),
            },
            # what a synchronous trainer waits for: the batch's last end to its last reward
            "last_end_to_all_rewards_s": round(max(done.values()) - max(ends.values()), 3),
            "judge_asked": judge.asked,
            "_rewards": rewards,
        }
        print(f"  {mode}: {out['end_to_reward_s']}, batch {out['last_end_to_all_rewards_s']} s "
              f"({out['seconds_total']} s in all)",
              file=sys.stderr)  # fmt: skip
        return out

    runs = {mode: run(mode) for mode in ("post_hoc_batch", "post_hoc_each", "inline")}
    equal = all(r["_rewards"] == runs["inline"]["_rewards"] for r in runs.values())

    def ratio(mode: str, key: str = "mean") -> float:
        if key == "batch":
            ours = runs["inline"]["last_end_to_all_rewards_s"]
            return round(runs[mode]["last_end_to_all_rewards_s"] / ours, 2)
        return round(runs[mode]["end_to_reward_s"][key] / runs["inline"]["end_to_reward_s"][key], 2)

    steps = sum(len(t.steps) for t in rollouts)
    report = {
        **report_head("inline_latency", args, len(rollouts)),
        "steps": steps,
        "rewards_equal": equal,
        "post_hoc_batch_over_inline_mean": ratio("post_hoc_batch"),
        "post_hoc_batch_over_inline_batch": ratio("post_hoc_batch", "batch"),
        "post_hoc_each_over_inline_mean": ratio("post_hoc_each"),
        "runs": {k: {x: y for x, y in v.items() if not x.startswith("_")} for k, v in runs.items()},
    }
    print(f"{len(rollouts)} rollouts ({steps} steps), {args.turn_s:g} s a turn, a judge of "
          f"{args.slots} slots at {args.judge_ms:g} ms a step")  # fmt: skip
    print("seconds from a rollout's end to its reward (mean, median, p95, max), and from the "
          "batch's last end to its last reward (batch)")  # fmt: skip
    print(f"{'mode':<14} {'mean':>7} {'median':>7} {'p95':>7} {'max':>7} {'batch':>7}")
    for mode, r in runs.items():
        e = r["end_to_reward_s"]
        print(f"{mode:<14} {e['mean']:>7} {e['median']:>7} {e['p95']:>7} {e['max']:>7} "
              f"{r['last_end_to_all_rewards_s']:>7}")  # fmt: skip
    print(f"post_hoc_batch / inline: {ratio('post_hoc_batch')}x (mean), "
          f"{ratio('post_hoc_batch', 'batch')}x (batch); post_hoc_each / inline: "
          f"{ratio('post_hoc_each')}x (mean); rewards equal: {equal}")  # fmt: skip
    write_report(report, args.out, "inline_latency")


if __name__ == "__main__":
    main()
