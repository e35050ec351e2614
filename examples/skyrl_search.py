"""A few SkyRL episodes of stepgap's search environment (`stepgap_search`), with a policy behind
an OpenAI-compatible URL: each episode is made by `skyrl_gym.make` and driven as SkyRL's
generator drives it (`init`, `step` on each turn until done, `get_metrics`, `close`), so what it
prints is what SkyRL would train on: each turn's reward, the episode's reward, the batch's
metrics.

Start first (each in its own shell), then run this script:

    stepgap serve --judge openai:gpt-4.1-mini \\
        --nli MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli --port 8100   # the checker
    stepgap serve-index wiki_index --port 8000                           # the retriever
    vllm serve Qwen/Qwen2.5-3B-Instruct --port 8001                      # the policy

    python examples/skyrl_search.py --policy-url http://127.0.0.1:8001/v1 \\
        --model Qwen/Qwen2.5-3B-Instruct --reward-url http://127.0.0.1:8100

The policy continues one growing assistant message (SkyRL's
`generator.use_conversation_multi_turn=false`, its Search-R1 recipe's default), stopping at
`</search>` or `</answer>`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from stepgap.data_builders.rollout_formats import SEARCH_R1_TEMPLATE, Rollout, SearchR1Format

EXAMPLES = Path(__file__).resolve().parent
SYSTEM = "You are a helpful and harmless assistant."  # SkyRL's Search-R1 data


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--policy-url", required=True, help="the policy's OpenAI-compatible /v1 URL")
    p.add_argument("--model", required=True, help="the policy's served model name")
    checker = p.add_mutually_exclusive_group(required=True)
    checker.add_argument("--reward-url", help="`stepgap serve` (replicas comma-separated)")
    checker.add_argument("--reward-config", help="a reward config file (checker in process)")
    p.add_argument("--retriever-url", default="http://127.0.0.1:8000/retrieve")
    p.add_argument("--questions", type=Path, default=EXAMPLES / "rollout_questions.jsonl",
                   help="JSONL rows with question and golden_answers")  # fmt: skip
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=4, help="SkyRL's generator.max_turns")
    p.add_argument("--feedback", choices=("none", "typed"), default="none")
    p.add_argument("--feedback-wait", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=int, default=500)
    return p.parse_args(argv)


def rows(path: Path, n: int) -> list[dict[str, Any]]:
    """SkyRL's Search-R1 rows (prompt, reward_spec, extra_info) for the first `n` questions."""
    from stepgap.data_builders.qa import QAItem

    items = [QAItem(**{k: v for k, v in json.loads(line).items() if k in QAItem.model_fields})
             for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]  # fmt: skip
    return [{"item": it,
             "prompt": [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": SEARCH_R1_TEMPLATE.format(question=it.question)}],
             "extras": {"reward_spec": {"ground_truth": {"target": it.golden_answers}},
                        "extra_info": {"question": it.question}}}
            for it in items[:n]]  # fmt: skip


def episode(row: dict[str, Any], policy: Any, env_config: dict[str, Any], max_turns: int):
    """One trajectory as SkyRL's agent loop runs it."""
    import skyrl_gym

    import stepgap.serving.skyrl as env_module

    extras = {**row["extras"], "max_turns": max_turns}
    env = skyrl_gym.make(env_module.ENV_ID, env_config=env_config, extras=extras)
    prompt, _ = env.init(row["prompt"])
    rollout = Rollout(item=row["item"], sample=0, trace_id=env.trace_id, messages=prompt)
    rewards, done = [], False
    while not done:
        (turn,) = policy.generate([rollout], SearchR1Format.stops)
        out = env.step(turn.text)
        rollout.prefix += turn.text + "".join(m["content"] for m in out["observations"])
        rewards.append(out["reward"])
        done = out["done"]
    metrics = env.get_metrics()
    env.close()
    return rewards, metrics


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = arguments(argv)
    from skyrl_gym.metrics import aggregate_for_environment

    from stepgap.data_builders.policies import OpenAIPolicy
    from stepgap.serving.skyrl import ENV_ID

    policy = OpenAIPolicy(args.model, base_url=args.policy_url, max_new_tokens=args.max_new_tokens)
    env_config = {"url": args.reward_url, "config": args.reward_config,
                  "search_url": args.retriever_url, "feedback": args.feedback,
                  "feedback_wait": args.feedback_wait}  # fmt: skip
    all_metrics = []
    for row in rows(args.questions, args.episodes):
        rewards, metrics = episode(row, policy, env_config, args.max_turns)
        all_metrics.append(metrics)
        print(f"{row['item'].id}: turn rewards {rewards} -> {sum(rewards):.4f}")
    summary = aggregate_for_environment(ENV_ID, all_metrics)
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
