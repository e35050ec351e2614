"""Typed feedback inside the rollout: how many gaps' notes reach the policy's next turn, what
the rollouts pay for them in time, and the rewards with and without notes, side by side.

    python bench/feedback_latency.py [--rollouts 64] [--turn-s 2] [--judge-ms 300] [--slots 16]

`--rollouts` rollouts start together, as a GRPO step's do. Each replays one of the example
traces (a step per search, then the answer), cycled under distinct ids: every turn takes
`--turn-s` seconds to generate, then its search result comes back. The judge is an engine of
`--slots` slots that answers each step after `--judge-ms` ms (the stored answers of the example
steps, so labels and rewards are the real ones); the NLI answers are the stored ones. As each
search result comes back, the rollout's text so far goes to a `StreamingReward`:

- `off`: feedback none (`submit_response`: nothing is waited for, nothing sent back);
- `wait_0`: typed feedback with no wait: a note is sent only if its verdict is already in;
- `wait_judge`, `wait_2judge`: typed feedback waiting up to one judge latency (`--judge-ms`)
  for it, or two (a step's check is the judge's call and the tree's, a little over one);
- `wait_queue`: waiting as long as every rollout's step needs to get one of the judge's slots
  (the rollouts' steps come together: rollouts / slots rounds of the judge, and one more).

A note that is sent goes into the rollout's text after its search result, as the agent loops
put it. Prints, for each mode, the share of the searches' gap steps whose note reached the next
turn, the seconds each search turn waited (mean, p95), the rollout's length, and the mean
reward of the finished texts (with their notes) against `off`'s; writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inline_latency import (
    EngineJudge,
    engine_args,
    percentile,
    replayed,
    report_head,
    write_report,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# the wait, in judge latencies ("queue": enough for every rollout's step to get a slot, the
# rollouts' steps arriving together: rollouts / slots rounds, and one more)
MODES = {"off": None, "wait_0": 0.0, "wait_judge": 1.0, "wait_2judge": 2.0, "wait_queue": "queue"}


def cuts(response: str) -> list[int]:
    """Where each search result ends: the rollout's text up to there completes a step."""
    return [m.end() for m in re.finditer(r"</information>", response)]


@dataclass
class Bench:
    """The workload: the flags, the replayed rollouts, the stored judge and NLI answers, and the
    post-hoc labels of the example steps."""

    args: argparse.Namespace
    rollouts: list
    replay: Any
    nli: Any
    labels: dict

    def wait_of(self, mode: str) -> float | None:
        wait = MODES[mode]
        if wait == "queue":
            wait = math.ceil(self.args.rollouts / self.args.slots) + 1
        return None if wait is None else wait * self.args.judge_ms / 1000

    def run(self, mode: str) -> dict:
        """All the rollouts at once with this mode's feedback; what it measured."""
        from stepgap.serving.reward_function import StepGapReward
        from stepgap.serving.streaming import StreamingReward
        from stepgap.teacher.checker import Checker

        judge = EngineJudge(self.replay, self.args.slots, self.args.judge_ms / 1000)
        stream = StreamingReward(StepGapReward(Checker(judge, self.nli)))
        seen: dict = {"waited": [], "lengths": {}, "rewards": {}}
        wait = self.wait_of(mode)
        start = time.perf_counter()
        with ThreadPoolExecutor(len(self.rollouts)) as pool:
            counts = list(pool.map(lambda t: self.rollout(t, stream, wait, seen), self.rollouts))
        stream.close()
        reached, gaps = sum(c[0] for c in counts), sum(c[1] for c in counts)
        waited = seen["waited"]
        rewarded = [r for r in seen["rewards"].values() if r is not None]
        out = {
            "seconds_total": round(time.perf_counter() - start, 2),
            "gap_notes_reached": reached,
            "gap_steps": gaps,
            "share_reached": round(reached / gaps, 3) if gaps else 0.0,
            "wait_per_turn_s": {
                "mean": round(statistics.mean(waited), 3) if waited else 0.0,
                "p95": round(percentile(waited, 0.95), 3) if waited else 0.0,
            },
            "rollout_s_mean": round(statistics.mean(seen["lengths"].values()), 3),
            "reward_mean": round(statistics.mean(rewarded), 6) if rewarded else None,
            "no_reward": len(seen["rewards"]) - len(rewarded),  # a failed step check
            "judge_asked": judge.asked,
            "_rewards": seen["rewards"],
        }
        print(f"  {mode}: {out['gap_notes_reached']}/{out['gap_steps']} notes, wait "
              f"{out['wait_per_turn_s']}, rollout {out['rollout_s_mean']} s", file=sys.stderr)  # fmt: skip
        return out

    def rollout(self, trace, stream, wait: float | None, seen: dict) -> tuple[int, int]:
        """One rollout's turns; (its notes sent, its searches' gap steps)."""
        text, done, sent, gap_steps = "", 0, 0, 0
        started = time.perf_counter()
        original = trace.id.rsplit("#", 1)[0]
        for i, cut in enumerate(cuts(trace.response)):
            time.sleep(self.args.turn_s)  # the turn, then its search result
            text += trace.response[done:cut]
            done = cut
            gap_steps += self.labels.get((original, i)) not in (None, "no_gap")
            if wait is None:
                stream.submit_response(trace.id, trace.question, text)
                continue
            told = stream.tell(trace.id, trace.question, text, wait)
            seen["waited"].append(told.waited)
            if told.note is not None:
                sent += 1
                text += f"\n\n{told.note}"
        time.sleep(self.args.turn_s)  # the answer turn: the rollout ends
        text += trace.response[done:]
        seen["lengths"][trace.id] = time.perf_counter() - started
        result = stream.score(text, trace.question, trace.golden_answers or [], trace.id)
        seen["rewards"][trace.id] = result.reward
        return sent, gap_steps


def print_table(runs: dict, equal: bool) -> None:
    print(f"{'mode':<11} {'notes':>9} {'share':>6} {'wait mean':>9} {'wait p95':>9} "
          f"{'rollout s':>9} {'+%':>6} {'reward':>9}")  # fmt: skip
    base = runs["off"]["rollout_s_mean"]
    for mode, r in runs.items():
        w = r["wait_per_turn_s"]
        added = 100 * (r["rollout_s_mean"] / base - 1)
        print(f"{mode:<11} {r['gap_notes_reached']:>4}/{r['gap_steps']:<4} {r['share_reached']:>6} "
              f"{w['mean']:>9} {w['p95']:>9} {r['rollout_s_mean']:>9} {added:>6.1f} "
              f"{str(r['reward_mean']):>9}")  # fmt: skip
    print(f"rewards equal with and without notes: {equal}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    engine_args(p)
    args = p.parse_args()

    from stepgap.io import read_models
    from stepgap.schema import Verdict
    from stepgap.segment import iter_traces
    from stepgap.teacher.judges.replay import ReplayJudge
    from stepgap.teacher.nli.replay import ReplayNLI

    examples = [t for t in iter_traces(EXAMPLES / "traces.jsonl") if cuts(t.response or "")]
    verdicts = read_models(EXAMPLES / "teacher_verdicts.jsonl", Verdict)
    bench = Bench(
        args, replayed(examples, args.rollouts), ReplayJudge.from_file(EXAMPLES / "judge_replay.jsonl"),
        ReplayNLI.from_file(EXAMPLES / "nli_replay.jsonl"),
        {(v.trace_id, v.step): v.label for _, v in verdicts},  # the post-hoc labels
    )  # fmt: skip
    runs = {mode: bench.run(mode) for mode in MODES}
    equal = all(r["_rewards"] == runs["off"]["_rewards"] for r in runs.values())
    rollouts = bench.rollouts
    turns = sum(len(cuts(t.response or "")) + 1 for t in rollouts) / len(rollouts)
    report = {
        **report_head("feedback_latency", args, len(rollouts)),
        "turns_per_rollout": round(turns, 2),
        "rewards_equal_with_and_without_notes": equal,
        "runs": {k: {x: y for x, y in v.items() if not x.startswith("_")} for k, v in runs.items()},
    }
    print(f"{len(rollouts)} rollouts ({turns:.2f} turns each), {args.turn_s:g} s a turn, a judge "
          f"of {args.slots} slots at {args.judge_ms:g} ms a step")  # fmt: skip
    print_table(runs, equal)
    write_report(report, args.out, "feedback_latency")


if __name__ == "__main__":
    main()
