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
from stepgap.serving.reward_function import available


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


def openrlhf_response(results: Sequence[RewardResult]) -> dict[str, Any]:
    """What OpenRLHF reads back: `rewards` (and `scores`), and per-sample `extra_logs`. A
    rollout without a reward raises `RewardUnavailable` (OpenRLHF then gives it none: the
    server answers it non-200, the in-process function fails)."""
    for r in results:
        available(r)
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
