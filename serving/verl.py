"""The stepgap reward as a veRL custom reward function (veRL 0.9).

In the veRL config (`reward.custom_reward_function`):

    custom_reward_function:
      path: pkg://stepgap.serving.verl     # or the file: <site-packages>/stepgap/serving/verl.py
      name: compute_score                  # compute_score_batch for a batch manager,
                                           # compute_score_float for prime
      reward_kwargs:                       # optional; else the environment (below)
        url: http://reward-node:8000       # `stepgap serve` (a list: several replicas)
        variant: typed_shape
        lam: 1.0

with `reward.reward_manager.name` one of veRL's own managers (naive, dapo, gdpo, rate_limited;
the per-sample `compute_score` fits all of them). veRL loads this module by file path, so it uses
absolute imports only. The reward is built once per process, from `reward_kwargs` (`url` or
`urls`, or `config`: a JSON file `{"judge", "nli"}` or `{"bundle"}`, with `variant`, `lam`),
else from `configure(reward)`, else from the environment: `STEPGAP_REWARD_URL` (comma-separated
for replicas) or `STEPGAP_REWARD_CONFIG` (the JSON file). When veRL's reward model is enabled,
it adds `reward_router_address` and `reward_model_tokenizer`: with a bundle in the JSON file,
stages A-C are then asked of the bundle's student that veRL serves behind that router
(`process_reward.served_by_router`; the served name is the tokenizer's path, veRL's `model_path`,
or `reward_kwargs.served_model`). Its `extra_info` fields are accepted.

The question is read from `extra_info["question"]`: veRL gives a reward function the response
but never the prompt. Search-R1's parquet keeps the question only in the prompt, so
`stepgap prepare-verl-data` adds it; without it the first call raises, naming that command, so
training stops at step 1 rather than scoring against a guessed question.

The dense (token-level) form is `stepgap.serving.verl_manager.StepGapRewardManager`.

No reward: veRL has no way to leave a sample unrewarded, so a rollout with a failed step check
(a judge that is down, an answer that cannot be parsed) raises `RewardUnavailable` naming the
failure: veRL's naive and batch managers stop the run with it, its `rate_limited` manager
scores the sample 0 and logs the error. `reward_kwargs: {on_failed_check: zero}` (or the key in
the JSON file) scores such a rollout instead, its failed steps earning 0.

Tokenizers: veRL decodes responses with `skip_special_tokens=True`. A tokenizer that marks the
tags (`<tool_call>`, `<search>`, ...) as *special* tokens loses them in that decode, and such a
response cannot be segmented (it is then scored on EM alone and counted as `unsegmented`).
Qwen2.5's tokenizer keeps `<tool_call>` as a normal added token; keep it that way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepgap.data_builders.qa import question_line
from stepgap.serving.framework_inputs import golden_list
from stepgap.serving.process_reward import configure, get_reward
from stepgap.serving.reward_function import available

__all__ = [
    "PREPARE_COMMAND",
    "compute_score",
    "compute_score_batch",
    "compute_score_float",
    "configure",
    "question_of",
]

PREPARE_COMMAND = "stepgap prepare-verl-data TRAIN.parquet -o TRAIN_WITH_QUESTIONS.parquet"


def question_of(extra_info: dict[str, Any] | None, prompt: str | None = None) -> str:
    """The question a rollout answers: `extra_info["question"]`, else the `Question:` line of
    the prompt text (when the caller has it: the dense manager does, `compute_score` never).
    Never the response: a retrieved document may hold a `Question:` line of its own."""
    if extra_info and extra_info.get("question"):
        return str(extra_info["question"])
    found = question_line(prompt) if prompt else None
    if found:
        return found
    keys = ", ".join(sorted(extra_info or {})) or "nothing"
    nor = " and its prompt no `Question:` line" if prompt is not None else ""
    raise ValueError(
        f"the stepgap reward needs the question in extra_info['question'] (this row's extra_info "
        f"has {keys}{nor}); Search-R1's parquet keeps it only in the prompt: add it with "
        f"`{PREPARE_COMMAND}` and train on the new file"
    )


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """veRL's per-sample signature; returns `{"score": R, ...scalar breakdown}`."""
    (result,) = compute_score_batch(
        [data_source], [solution_str], [ground_truth], [extra_info], **kwargs
    )
    return result


def compute_score_float(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> float:
    """The reward alone, as a float: for managers that read a number (veRL's prime manager
    calls `float(result)` and scores a dict 0)."""
    return float(
        compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)["score"]
    )


def compute_score_batch(
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[dict[str, Any] | None],
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """veRL's batch signature: one checker call for the whole batch. Every question is found
    before the checker is asked, so data without them fails on the first batch, at no cost."""
    if len(extra_infos) != len(solution_strs):
        raise ValueError(f"{len(solution_strs)} responses but {len(extra_infos)} extra_info")
    questions = [question_of(e) for e in extra_infos]
    reward = get_reward(kwargs)
    results = reward.score(list(solution_strs), questions, [golden_list(g) for g in ground_truths])
    for r in results:
        available(r)  # RewardUnavailable: veRL's own handling of a failed reward function
    return [r.scalars() for r in results]
