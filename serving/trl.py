"""The reward as a TRL reward function: `GRPOTrainer(reward_funcs=[stepgap_reward_func(...)])`.

TRL calls it with `prompts`, `completions` (plain strings or conversational message lists) and
every dataset column as a keyword argument; the golden answers come from the `golden_answers`
column (Search-R1's name; another column via `answers_column`). Per-label step rates and EM are
logged through TRL's `log_metric` when it is passed.

`SearchEnvironment` gives TRL's tool loop Search-R1's retriever as the `search` tool
(`GRPOTrainer(environment_factory=SearchEnvironment, ...)`); a tool-calling completion is scored
whole, each search a step (`inputs.text_of`). Its steps are checked when the reward function
runs, after the rollouts: TRL hands a tool only its arguments and `get_reward()` nothing, so
neither sees the assistant's text that holds a step's claim, and no step can be checked while
TRL's rollout runs (veRL's agent loop and OpenRLHF's executor can: `verl_agent.py`,
`openrlhf_agent.py`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from stepgap.data_builders.retrieval import search_passages, tool_retriever
from stepgap.reward_arithmetic import RewardResult

from .framework_inputs import golden_list, question_from_prompt, text_of
from .reward_function import StepGapReward


def _rates(results: Sequence[RewardResult]) -> dict[str, float]:
    counts = Counter(s.label for r in results for s in r.steps)
    total = sum(counts.values())
    rates = {
        f"stepgap/rate_{lab}": (counts.get(lab, 0) / total if total else 0.0)
        for lab in ("no_gap", "CC", "IE", "MB")
    }
    n = len(results)
    rates["stepgap/failed_checks"] = sum(r.failed_checks for r in results) / total if total else 0.0
    rates["stepgap/unsegmented"] = sum(r.unsegmented for r in results) / n if n else 0.0
    rates["stepgap/em"] = sum(r.em for r in results) / n if n else 0.0
    return rates


def _score(
    reward: StepGapReward,
    prompts: Sequence[Any],
    completions: Sequence[Any],
    answers_column: str,
    question_column: str,
    kwargs: dict[str, Any],
) -> list[float | None]:
    if answers_column not in kwargs:
        raise ValueError(
            f"the stepgap reward needs the dataset column {answers_column!r} (golden answers); "
            f"columns passed: {sorted(k for k in kwargs if k not in ('trainer_state', 'log_metric', 'log_extra'))}"
        )
    golden = [golden_list(g) for g in kwargs[answers_column]]
    questions = kwargs.get(question_column) or [question_from_prompt(p) for p in prompts]
    responses = [text_of(c) for c in completions]
    results = reward.score(responses, list(questions), golden)
    log_metric = kwargs.get("log_metric")
    if callable(log_metric):
        for name, value in _rates(results).items():
            log_metric(name, value)
    # TRL's own "no reward": a None leaves the completion out of its group's baseline
    return [None if r.unavailable is not None else r.reward for r in results]


def stepgap_reward_func(
    reward: StepGapReward,
    *,
    answers_column: str = "golden_answers",
    question_column: str = "question",
) -> Callable[..., list[float | None]]:
    """A plain callable TRL reward function (its `__name__` names the logged reward); a rollout
    with a failed check gets None, TRL's "no reward" (see `StepGapReward.on_failed_check`)."""

    def reward_func(
        prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        return _score(reward, prompts, completions, answers_column, question_column, kwargs)

    reward_func.__name__ = f"stepgap_{reward.variant}"
    return reward_func


def stepgap_async_reward_func(
    reward: StepGapReward,
    *,
    answers_column: str = "golden_answers",
    question_column: str = "question",
) -> Callable[..., Any]:
    """The same as an `async` function: TRL runs async reward functions concurrently."""

    async def reward_func(
        prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        return await asyncio.to_thread(
            _score, reward, prompts, completions, answers_column, question_column, kwargs
        )

    reward_func.__name__ = f"stepgap_{reward.variant}_async"
    return reward_func


class SearchEnvironment:
    """Search-R1's retriever as a TRL environment: one per rollout, its `search` method a tool.
    The retriever's address: `url`, else `STEPGAP_RETRIEVER_URL` (default
    http://127.0.0.1:8000/retrieve); `topk` passages a search."""

    def __init__(self, url: str | None = None, topk: int = 3) -> None:
        self.retriever = tool_retriever(url)
        self.topk = topk
        self.queries: list[str] = []

    def reset(self, **example: Any) -> None:
        """A new rollout (TRL passes the dataset row); the prompt stays as it is."""
        self.queries = []

    def search(self, query: str) -> str:
        """Search the corpus and return the top documents for a query.

        Args:
            query: the search query
        """
        self.queries.append(query)
        return search_passages(self.retriever, query, self.topk)
