"""Score rollouts as slime's `remote_rm` asks `stepgap serve` for them: one POST a sample of
`{"prompt", "response", "label"}` to `/remote_rm`, the JSON answer as the reward; a non-2xx
answer is raised and tried again (slime: 10 tries with backoff, 120 s each), so a sample whose
check failed ends with its error, never a number.

Start the checker first, then run this script:

    stepgap serve --judge openai:gpt-4.1-mini \\
        --nli MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli --port 8100

    python examples/slime_remote_rm.py --rm-url http://127.0.0.1:8100/remote_rm

In slime itself the same server is `--rm-type remote_rm --rm-url http://HOST:8100/remote_rm
--label-key reward_model` (docs/rl/slime.md). Each row of the rollouts file has `response`,
`golden_answers` and `question`; the label is sent as Search-R1's `reward_model` column.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx

EXAMPLES = Path(__file__).resolve().parent


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rm-url", required=True, help="stepgap serve's /remote_rm (slime's --rm-url)")
    p.add_argument("--rollouts", default=str(EXAMPLES / "traces.jsonl"), help="JSONL rollouts")
    p.add_argument("--tries", type=int, default=10, help="tries a sample (slime: 10)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a try (slime: 120)")
    p.add_argument("--limit", type=int, default=None, help="score the first N rows only")
    return p.parse_args(argv)


def remote_rm(client: httpx.Client, url: str, payload: dict, tries: int) -> float:
    """slime's client: raise on a non-2xx answer, back off and try again, then give up."""
    for attempt in range(tries):
        try:
            answer = client.post(url, json=payload)
            answer.raise_for_status()
            return answer.json()
        except httpx.HTTPError:
            if attempt + 1 >= tries:
                raise
            time.sleep(min(2**attempt, 30))


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    lines = Path(args.rollouts).read_text(encoding="utf-8").splitlines()[: args.limit]
    rewarded = 0
    with httpx.Client(timeout=args.timeout) as client:
        for row in map(json.loads, lines):
            payload = {
                "prompt": f"Question: {row['question']}\n",
                "response": row["response"],
                "label": {"ground_truth": {"target": row["golden_answers"]}},
            }
            try:
                out = {
                    "id": row.get("id"),
                    "reward": remote_rm(client, args.rm_url, payload, args.tries),
                }
                rewarded += 1
            except httpx.HTTPStatusError as exc:  # what slime would raise: no reward
                out = {"id": row.get("id"), "no_reward": exc.response.text[:300]}
            print(json.dumps(out), flush=True)
    print(json.dumps({"rewarded": rewarded, "of": len(lines)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
