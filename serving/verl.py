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

with `reward.reward_manager.name` one of veRL's own managers (naive, dapo, gdpo, limited; the
per-sample `compute_score` fits all of them). veRL loads this module by file path, so it uses
absolute imports only. The reward is built once per process, from `reward_kwargs` (`url` or
`urls`, or `config`: a JSON file `{"judge", "nli"}` or `{"bundle"}`, with `variant`, `lam`),
else from `configure(reward)`, else from the environment: `STEPGAP_REWARD_URL` (comma-separated
for replicas) or `STEPGAP_REWARD_CONFIG` (the JSON file). Keyword arguments veRL adds
(`reward_router_address`, `reward_model_tokenizer`, its `extra_info` fields) are accepted.

The dense (token-level) form is `stepgap.serving.verl_manager.StepGapRewardManager`.

Tokenizers: veRL decodes responses with `skip_special_tokens=True`. A tokenizer that marks the
tags (`<tool_call>`, `<search>`, ...) as *special* tokens loses them in that decode, and such a
response cannot be segmented (it is then scored on EM alone and counted as `unsegmented`).
Qwen2.5's tokenizer keeps `<tool_call>` as a normal added token; keep it that way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepgap.serving.configured import configure, get_reward
from stepgap.serving.inputs import golden_list, question_from_prompt

__all__ = ["compute_score", "compute_score_batch", "compute_score_float", "configure"]


def _question(solution_str: str, extra_info: dict[str, Any] | None) -> str:
    if extra_info and extra_info.get("question"):
        return str(extra_info["question"])
    if "Question:" in solution_str:
        return question_from_prompt(solution_str)
    raise ValueError("the stepgap reward needs the question: put it in extra_info['question']")


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
    """veRL's batch signature: one checker call for the whole batch."""
    reward = get_reward(kwargs)
    questions = [_question(s, e) for s, e in zip(solution_strs, extra_infos, strict=True)]
    results = reward.score(list(solution_strs), questions, [golden_list(g) for g in ground_truths])
    return [r.scalars() for r in results]
