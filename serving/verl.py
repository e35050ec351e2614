"""The reward as a veRL custom reward function.

In the veRL config:
    custom_reward_function:
      path: <site-packages>/stepgap/serving/verl.py   (or a file that imports from it)
      name: compute_score            # or compute_score_batch with the batch reward manager
The checker is set once per worker with `configure(reward)`, or built lazily from the
environment: `STEPGAP_REWARD_URL` (a `stepgap serve` endpoint) or `STEPGAP_REWARD_CONFIG` (a
JSON file `{"judge": SPEC, "nli": SPEC, "variant": ..., "lam": ...}`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from .inputs import golden_list, question_from_prompt
from .reward import StepGapReward

_REWARD: StepGapReward | None = None


def configure(reward: StepGapReward) -> None:
    global _REWARD
    _REWARD = reward


def _reward() -> StepGapReward:
    global _REWARD
    if _REWARD is None:
        if os.environ.get("STEPGAP_REWARD_URL"):
            from .remote import RemoteChecker

            _REWARD = StepGapReward(RemoteChecker(os.environ["STEPGAP_REWARD_URL"]))
        elif os.environ.get("STEPGAP_REWARD_CONFIG"):
            from stepgap.teacher import Checker, load_judge, load_nli

            with open(os.environ["STEPGAP_REWARD_CONFIG"], encoding="utf-8") as fh:
                cfg = json.load(fh)
            checker = Checker(load_judge(cfg["judge"]), load_nli(cfg["nli"]))
            _REWARD = StepGapReward(
                checker, cfg.get("variant", "typed_shape"), float(cfg.get("lam", 1.0))
            )
        else:
            raise RuntimeError(
                "stepgap veRL reward is not configured: call stepgap.serving.verl.configure(...) or "
                "set STEPGAP_REWARD_URL or STEPGAP_REWARD_CONFIG"
            )
    return _REWARD


def _question(solution_str: str, extra_info: dict[str, Any] | None) -> str:
    if extra_info and extra_info.get("question"):
        return str(extra_info["question"])
    if "Question:" in solution_str:
        return question_from_prompt(solution_str)
    raise ValueError("the stepgap reward needs the question: put it in extra_info['question']")


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
) -> dict[str, Any]:
    """veRL's per-sample signature; returns `{"score": R, ...scalar breakdown}`."""
    (result,) = compute_score_batch([data_source], [solution_str], [ground_truth], [extra_info])
    return result


def compute_score_batch(
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[dict[str, Any] | None],
) -> list[dict[str, Any]]:
    """veRL's batch signature: one checker call for the whole batch."""
    reward = _reward()
    questions = [_question(s, e) for s, e in zip(solution_strs, extra_infos, strict=True)]
    results = reward.score(list(solution_strs), questions, [golden_list(g) for g in ground_truths])
    return [r.scalars() for r in results]
