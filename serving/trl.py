"""The reward as a TRL reward function: `GRPOTrainer(reward_funcs=[stepgap_reward_func(...)])`.

TRL calls it with `prompts`, `completions` (plain strings or conversational message lists) and
every dataset column as a keyword argument; the golden answers come from the `golden_answers`
column (Search-R1's name; another column via `answers_column`). Per-label step rates and EM are
logged through TRL's `log_metric` when it is passed.

`SearchEnvironment` gives TRL's tool loop Search-R1's retriever as the `search` tool
(`GRPOTrainer(environment_factory=SearchEnvironment, ...)`); a tool-calling completion is scored
whole, each search a step (`inputs.text_of`). TRL hands a tool only its arguments, so its steps
are checked when the reward function runs, after the rollouts. With typed feedback
(`SearchEnvironment(feedback="typed")`, under `trl_trainer.StepGapGRPOTrainer`, whose tool loop
shows each environment its rollout's conversation) each search is checked as its result comes
back, and the result goes back with the note for its step when the verdict comes within
`feedback_wait` seconds. TRL runs the tools of a batch one rollout after another, so a wait
adds up over the batch: keep it 0 (only verdicts already in) unless the batch is small.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import Any
from uuid import uuid4

from stepgap.data_builders.retrieval import search_passages, tool_retriever
from stepgap.feedback import Told, check_mode, feedback_counts

from .framework_inputs import golden_list, question_from_prompt, text_of
from .inline import InlineChecker, inline_checker
from .reward_function import StepGapReward
from .training_logs import reward_logs


def _feedback(environments: Sequence[Any] | None) -> dict[str, float]:
    """The batch's typed feedback, a mean per rollout (TRL passes its environments)."""
    told = [feedback_counts(e.told) for e in environments or []
            if isinstance(e, SearchEnvironment) and e.feedback == "typed"]  # fmt: skip
    if not told:
        return {}
    return {f"stepgap/feedback_{k}": sum(c[k] for c in told) / len(told) for k in told[0]}


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
        for name, value in {
            **reward_logs(results),
            **_feedback(kwargs.get("environments")),
        }.items():
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
    http://127.0.0.1:8000/retrieve); `topk` passages a search.

    Typed feedback (`feedback="typed"`, else `STEPGAP_FEEDBACK`; see the module docstring): the
    checker is `checker`, else this process's inline checker (`STEPGAP_REWARD_URL` or
    `STEPGAP_REWARD_CONFIG`); the question is the row's `question` column, else its prompt's.
    Its public methods are TRL's tools: `search` is the only one."""

    def __init__(
        self,
        url: str | None = None,
        topk: int = 3,
        *,
        feedback: str | None = None,
        feedback_wait: float | None = None,
        checker: InlineChecker | None = None,
    ) -> None:
        self.retriever = tool_retriever(url)
        self.topk = topk
        self.queries: list[str] = []
        self.feedback = check_mode(feedback or os.environ.get("STEPGAP_FEEDBACK", "none"))
        wait = os.environ.get("STEPGAP_FEEDBACK_WAIT", "0")
        self.feedback_wait = float(wait if feedback_wait is None else feedback_wait)
        self.checker = checker
        self.conversation: list[dict[str, Any]] | None = None  # set by StepGapGRPOTrainer
        self.question = ""
        self.trace_id = ""
        self.told: list[Told] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def reset(self, **example: Any) -> None:
        """A new rollout (TRL passes the dataset row); the prompt stays as it is."""
        if self.feedback == "typed" and self.trace_id:
            self._run(self._checker().drop(self.trace_id))  # the last rollout's, if not asked
        self.queries = []
        self.conversation = None
        self.told = []
        self.trace_id = uuid4().hex
        question = example.get("question")
        self.question = question if isinstance(question, str) else question_from_prompt(
            example.get("prompt", "")
        )  # fmt: skip

    def search(self, query: str) -> str:
        """Search the corpus and return the top documents for a query.

        Args:
            query: the search query
        """
        self.queries.append(query)
        passages = search_passages(self.retriever, query, self.topk)
        if self.feedback == "none" or self.conversation is None:
            return passages
        tool = {"role": "tool", "name": "search", "content": passages}
        text = text_of([*self.conversation, tool])
        told = self._run(
            self._checker().tell(self.trace_id, self.question, text, self.feedback_wait)
        )
        self.told.append(told)
        return passages if told.note is None else f"{passages}\n{told.note}"

    def _checker(self) -> InlineChecker:
        if self.checker is None:
            self.checker = inline_checker()
        return self.checker

    def _run(self, work: Any) -> Any:
        """The checker's call on this environment's own event loop (its connections kept)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(work)
