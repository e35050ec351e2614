"""The reward for OpenRLHF: its remote reward protocol, served or in process.

OpenRLHF (0.11) asks for rewards in one of two ways, and stepgap answers both:

- `--reward.remote_url http://HOST:PORT/get_reward` (several URLs, comma-separated, are used
  in turn): `stepgap serve` answers `POST /get_reward`.
- `--reward.remote_url <site-packages>/stepgap/serving/openrlhf.py`: OpenRLHF loads this file
  and calls `reward_func(queries, prompts, labels)` in its process. The checker is then built from
  the environment: `STEPGAP_REWARD_URL` (one or more `stepgap serve` replicas, comma-separated:
  balanced, with failover) or `STEPGAP_REWARD_CONFIG` (a JSON file of `stepgap serve`'s checker
  flags: `{"judge", "nli"}` or `{"bundle"}`, `base_url`, ...), as for veRL.

This module is loaded by file path, so it uses absolute imports only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepgap.reward_arithmetic import RewardResult
from stepgap.serving.framework_inputs import golden_list, question_from_prompt
from stepgap.serving.reward_function import RewardUnavailable


def openrlhf_batch(
    query: Sequence[str], prompts: Sequence[str] | None, labels: Sequence[Any] | None
) -> tuple[list[str], list[str], list[list[str]]]:
    """OpenRLHF's reward inputs -> (responses, questions, golden answers).

    OpenRLHF sends each full text (prompt + response, decoded with its special tokens), the
    prompt and the label; the response is the text after the prompt, and the question is read
    from the prompt (Search-R1's `Question:` line, else the user turn).
    """
    n = len(query)
    prompts = list(prompts) if prompts is not None else [""] * n
    if labels is None:
        raise ValueError(
            "no labels (the golden answers): OpenRLHF sends them only when --data.label_key "
            "names their column, e.g. --data.label_key golden_answers"
        )
    if len(labels) != n or len(prompts) != n:
        raise ValueError(
            f"{n} queries, {len(prompts)} prompts and {len(labels)} labels: one of each per "
            "rollout (labels = golden answers)"
        )
    responses = [
        q[len(p) :] if p and q.startswith(p) else q for q, p in zip(query, prompts, strict=True)
    ]
    questions = [question_from_prompt(p or q) for q, p in zip(query, prompts, strict=True)]
    return responses, questions, [golden_list(g) for g in labels]


class UnrewardedBatch(RewardUnavailable):
    """A batch with rollouts that have no reward. OpenRLHF's protocol has no per-sample "no
    reward" (its client reads a whole `rewards` list of numbers, one per query, or fails the
    request), so the batch gets no answer; `detail` names each such rollout (its index in the
    batch, its trace id, why) and gives the others' rewards, null for those without."""

    def __init__(self, results: Sequence[RewardResult]) -> None:
        self.rewards = [r.reward for r in results]
        self.rollouts = [
            {"index": i, "trace_id": r.trace_id, "reason": r.unavailable}
            for i, r in enumerate(results)
            if r.reward is None
        ]
        named = "; ".join(f"[{m['index']}] {m['trace_id']}: {m['reason']}" for m in self.rollouts)
        super().__init__(
            f"no reward for {len(self.rollouts)} of {len(results)} rollout(s) of the batch, so "
            f"none is answered (OpenRLHF's reply has no per-rollout null; /reward has): {named}"
        )

    def detail(self) -> dict[str, Any]:
        """The JSON `detail` of the server's non-200 answer."""
        return {"message": str(self), "no_reward": self.rollouts, "rewards": self.rewards}


def openrlhf_response(results: Sequence[RewardResult]) -> dict[str, Any]:
    """What OpenRLHF reads back: `rewards` (and `scores`), and per-sample `extra_logs`. A batch
    with a rollout without a reward raises `UnrewardedBatch` (OpenRLHF then gives it none: the
    server answers it non-200, the in-process function fails), never a number for it."""
    if any(r.reward is None for r in results):
        raise UnrewardedBatch(results)
    breakdowns = [r.scalars() for r in results]
    extra = {
        k: [b[k] for b in breakdowns] for k in (breakdowns[0] if breakdowns else {}) if k != "score"
    }
    scores = [r.reward for r in results]
    return {"rewards": scores, "scores": scores, "extra_logs": extra}


def reward_func(
    queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any], **kwargs: Any
) -> dict[str, Any]:
    """OpenRLHF's `reward_func(queries, prompts, labels)`: the stepgap reward in process."""
    from stepgap.serving.verl import get_reward

    responses, questions, golden = openrlhf_batch(queries, prompts, labels)
    return openrlhf_response(get_reward(kwargs).score(responses, questions, golden))
