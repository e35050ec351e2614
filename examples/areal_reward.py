"""Score a JSONL of rollouts with the stepgap reward through AReaL's own `AsyncRewardWrapper`
(its process pool, its timeout and retries), as AReaL's RLVRWorkflow calls a reward function.

Each row has `response` (or `completion`), `golden_answers` (or `answer`) and `question` (or a
`prompt` with a `Question:` line): examples/traces.jsonl by default. Start the checker first:

    stepgap serve --judge openai:gpt-4.1-mini \\
        --nli MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli --port 8100

    python examples/areal_reward.py --reward-url http://127.0.0.1:8100

It checks the server's pace against AReaL's timeout first (refusing, in one line, a server too
slow for it), then prints one JSON line per rollout (its reward and logs, or why it has none)
and the batch's stepgap logs. Run it in the venv that has AReaL (docs/rl/areal.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parent


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    checker = p.add_mutually_exclusive_group(required=True)
    checker.add_argument("--reward-url", help="`stepgap serve` (replicas comma-separated)")
    checker.add_argument("--reward-config", help="a reward config file (checker in process)")
    p.add_argument("--rollouts", type=Path, default=EXAMPLES / "traces.jsonl",
                   help="JSONL rows: response, golden_answers, question or prompt")  # fmt: skip
    p.add_argument("--timeout", type=float, default=15.0,
                   help="AsyncRewardWrapper's timeout_seconds (RLVRWorkflow's: 15)")  # fmt: skip
    p.add_argument("--max-workers", type=int, default=2, help="AReaL's reward processes")
    p.add_argument("--limit", type=int, default=None, help="score the first N rows only")
    return p.parse_args(argv)


def read_rows(path: Path, limit: int | None) -> list[dict[str, Any]]:
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [json.loads(line) for line in lines[:limit]]


async def score_all(wrapper: Any, rows: list[dict[str, Any]]) -> list[Any]:
    """AReaL's call for each row: (prompt, completion, prompt ids, completion ids, **row), as
    many at once as the wrapper has processes (AReaL's timeout also runs while a call waits
    for one)."""
    room = asyncio.Semaphore(wrapper.max_workers)

    async def one(row: dict[str, Any]) -> Any:
        data = {k: v for k, v in row.items() if k not in ("prompt", "response", "completion")}
        completion = row.get("response", row.get("completion", ""))
        async with room:
            return await wrapper(row.get("prompt", ""), completion, [], [], **data)

    return await asyncio.gather(*(one(row) for row in rows), return_exceptions=True)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    from stepgap.serving.areal import AReaLReward, ServerTooSlow, StepGapRewardWrapper

    reward = AReaLReward(url=args.reward_url, config=args.reward_config, areal_timeout=args.timeout)
    try:
        seconds = reward.check_pace()
    except ServerTooSlow as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"# a rollout is checked in about {seconds or 0:.1f} s", file=sys.stderr)
    # AReaL's AsyncRewardWrapper, raising where it would give 0 (a call timed out in its pool)
    wrapper = StepGapRewardWrapper(
        reward, timeout_seconds=args.timeout, max_workers=args.max_workers
    )
    rows = read_rows(args.rollouts, args.limit)
    scored = asyncio.run(score_all(wrapper, rows))
    logs: dict[str, list[float]] = {}
    for row, got in zip(rows, scored, strict=True):
        line: dict[str, Any] = {"id": row.get("id")}
        if isinstance(got, BaseException):
            line["error"] = f"{type(got).__name__}: {got}"
        else:
            line["reward"], line["logs"] = float(got), got.logs
            for k, v in got.logs.items():
                logs.setdefault(k, []).append(v)
        print(json.dumps(line))
    means = {f"stepgap/{k}": sum(v) / len(v) for k, v in logs.items()}
    print(json.dumps({"rewarded": len(next(iter(logs.values()), [])), "of": len(rows), **means}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
