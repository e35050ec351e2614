"""The request and response bodies of `stepgap serve`, as pydantic models with examples.

FastAPI builds `/openapi.json` and the `/docs` page from them, so every route's input and
output is documented where clients look, and a malformed request is refused with the field
that is wrong (422).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stepgap.reward_arithmetic import RewardResult
from stepgap.schema import GapLabel, Trace, Verdict
from stepgap.segment import SegmentationError, segment_trace
from stepgap.teacher.judges.concurrency import EngineLimit

from .framework_inputs import golden_list

_RESPONSE = (
    "<think>I need the director of Whiplash.</think><search>Whiplash director</search>"
    '<information>Doc 1(Title: "Whiplash (2014 film)") Whiplash is a 2014 film written and '
    "directed by Damien Chazelle.</information><answer>Damien Chazelle</answer>"
)
_QUESTION = "Who directed Whiplash?"


class CheckRequest(BaseModel):
    """Traces to check, raw (`response`) or segmented (`steps`)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "traces": [
                        {
                            "id": "t1",
                            "question": _QUESTION,
                            "golden_answers": ["Damien Chazelle"],
                            "response": _RESPONSE,
                        }
                    ]
                }
            ]
        }
    )

    traces: list[Trace] = Field(min_length=1)


class CheckResponse(BaseModel):
    """One list of verdicts per trace, in request order, one verdict per step."""

    verdicts: list[list[Verdict]]


class RewardRequest(BaseModel):
    """Rollouts to score: the response text, its question and the golden answers, per rollout."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "responses": [_RESPONSE],
                    "questions": [_QUESTION],
                    "golden_answers": [["Damien Chazelle"]],
                }
            ]
        }
    )

    responses: list[str] = Field(min_length=1)
    questions: list[str]
    golden_answers: list[Any] = Field(
        description="per rollout: a string, a list of strings or veRL's {'target': [...]}"
    )
    trace_ids: list[str] | None = Field(
        None,
        description="per rollout, the id its steps were sent to /steps under while it ran: the "
        "answers already made are reused and only the rest is checked",
    )


class StepsRequest(BaseModel):
    """A rollout's text so far, sent each time a search result comes back: its complete steps
    not sent before are checked from now on, while the rollout goes on."""

    trace_id: str = Field(min_length=1, description="the rollout's id, the same in /reward")
    question: str
    response: str = Field(description="the rollout's text so far, search results included")
    feedback_wait: float | None = Field(
        None,
        ge=0,
        le=600,
        description="typed feedback: wait up to this many seconds for the newest step's "
        "verdict and answer its note (null: no feedback, the answer comes at once)",
    )


class StepsResponse(BaseModel):
    trace_id: str
    submitted: int = Field(description="steps of this call queued for checking")
    rollouts: int = Field(description="rollouts with steps sent and no reward asked yet")
    note: str | None = Field(
        None, description="typed feedback: the newest step's note (null: no gap, or not in time)"
    )
    late: bool = Field(False, description="typed feedback: the verdict did not come in time")
    waited_s: float = Field(0.0, description="typed feedback: seconds waited for the verdict")


class StepRewardOut(BaseModel):
    step: int
    label: GapLabel | None = Field(description="null when the step's check failed (bracket 0)")
    base: float
    shape: float
    bracket: float = Field(description="base + shape")
    span: list[int] | None = Field(description="the step's [start, end) characters")
    token_span: list[int] | None = None


class RewardResultOut(BaseModel):
    """The reward of one rollout (docs/contract.md, section 4)."""

    trace_id: str
    variant: str
    lam: float
    em: float
    reward: float | None = Field(
        description="em + lam * sum(bracket); null when the rollout has no reward (unavailable)"
    )
    steps: list[StepRewardOut]
    em_token: int | None = None
    failed_checks: int = Field(description="steps whose check failed: bracket 0 each")
    unsegmented: bool = Field(description="the response could not be segmented: EM alone")
    unavailable: str | None = Field(
        None,
        description="why the rollout has no reward (a failed step check, with "
        "on_failed_check=no_reward): `reward` is then null",
    )


class RewardResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "rewards": [1.4],
                    "results": [
                        {
                            "trace_id": "reward-0",
                            "variant": "typed_shape",
                            "lam": 1.0,
                            "em": 1.0,
                            "reward": 1.4,
                            "steps": [
                                {
                                    "step": 0,
                                    "label": "no_gap",
                                    "base": 0.2,
                                    "shape": 0.0,
                                    "bracket": 0.2,
                                    "span": [0, 221],
                                    "token_span": None,
                                },
                                {
                                    "step": 1,
                                    "label": "no_gap",
                                    "base": 0.2,
                                    "shape": 0.0,
                                    "bracket": 0.2,
                                    "span": [221, 251],
                                    "token_span": None,
                                },
                            ],  # fmt: skip
                            "em_token": None,
                            "failed_checks": 0,
                            "unsegmented": False,
                        }
                    ],
                }
            ]
        }
    )

    rewards: list[float | None] = Field(
        description="one per rollout; null when it has no reward (see its result's unavailable)"
    )
    results: list[RewardResultOut]


class OpenRLHFRequest(BaseModel):
    """OpenRLHF's remote reward payload (`--reward.remote_url .../get_reward`): the full texts
    (prompt + response), their prompts, and the labels (golden answers)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "query": [f"Question: {_QUESTION}\n{_RESPONSE}"],
                    "prompts": [f"Question: {_QUESTION}\n"],
                    "labels": [["Damien Chazelle"]],
                }
            ]
        }
    )

    query: list[str] = Field(min_length=1)
    prompts: list[str] | None = None
    labels: list[Any] | None = None


class OpenRLHFResponse(BaseModel):
    """What OpenRLHF's `remote_rm_fn` reads: `rewards` (and `scores`), plus per-sample logs."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "rewards": [1.4],
                    "scores": [1.4],
                    "extra_logs": {"em": [1.0], "dense": [0.4], "rate_no_gap": [1.0]},
                }
            ]
        }
    )

    rewards: list[float]
    scores: list[float]
    extra_logs: dict[str, list[float]]


class SlimeRequest(BaseModel):
    """slime's `remote_rm` payload (`--rm-type remote_rm --rm-url .../remote_rm`): one sample's
    prompt (its text, or chat messages), its response and its label (the golden answers: a
    string, a list, or Search-R1's `{"ground_truth": {"target": [...]}}`)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "prompt": f"Question: {_QUESTION}\n",
                    "response": _RESPONSE,
                    "label": {"ground_truth": {"target": ["Damien Chazelle"]}},
                }
            ]
        }
    )

    prompt: str | list[dict[str, Any]]
    response: str
    label: Any = None


class HealthResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"status": "ok", "variant": "typed_shape", "lam": 1.0, "queued": 0, "in_flight": 1}
            ]
        }
    )

    status: str = Field(
        description="ok; degraded while every step of the last checked request failed (the "
        "judge is down or answers nothing parseable); closing once a shutdown has begun"
    )
    variant: str
    lam: float
    on_failed_check: str = Field("no_reward", description="what a failed step check means")
    queued: int = Field(description="traces waiting for a checker batch")
    in_flight: int = Field(0, description="checker calls running")
    failed_checks: int = Field(0, description="step checks that failed since the start")
    judge_failure: str | None = Field(None, description="the judge's last error, while degraded")
    judge_limit: str | None = Field(
        None, description="judge requests in flight at most, and where that number comes from"
    )


# What a request's body means, for both servers (`server.py`, `ray_serve.py`): a ValueError is
# the request's fault and is answered 422 with its message.


def segmented_traces(traces: Sequence[Trace]) -> list[Trace]:
    """`/check`'s traces, segmented; one that cannot be is named by its position and id."""
    segmented = []
    for i, t in enumerate(traces):
        try:
            segmented.append(segment_trace(t))
        except SegmentationError as exc:
            raise ValueError(f"traces[{i}] ({t.id!r}): {exc}") from None
    return segmented


def rollout_traces(
    reward: Any,
    responses: list[str],
    questions: list[str],
    golden: list[Any],
    route: str,
    ids: list[str] | None = None,
) -> list[Trace]:
    """The rollouts of a `/reward` or `/get_reward` body as segmented traces (`reward.trace`:
    one that cannot be segmented is scored on EM alone), ids `ids` (the client's) or
    `ROUTE-i`."""
    lists = {"responses": responses, "questions": questions, "golden_answers": golden}
    if ids is not None:
        lists["trace_ids"] = ids
    if len({len(v) for v in lists.values()}) > 1:
        counts = ", ".join(f"{len(v)} {name}" for name, v in lists.items())
        raise ValueError(f"give {', '.join(lists)}: one of each per rollout (got {counts})")
    ids = ids if ids is not None else [f"{route}-{i}" for i in range(len(responses))]
    return [
        reward.trace(r, q, golden_list(g), tid)
        for r, q, g, tid in zip(responses, questions, golden, ids, strict=True)
    ]


class JudgeHealth:
    """Whether the judge works: `degraded` while its server cannot be reached (as its
    `EngineLimit` says, from the first connection refused), or while every step of the last
    checked request failed (a judge that answers nothing parseable); `ok` again once it
    answers, at the first step that gets a label."""

    def __init__(self, limit: EngineLimit | None = None) -> None:
        self.failure: str | None = None
        self.limit = limit

    def problem(self) -> str | None:
        """What is wrong with the judge, or None."""
        if self.limit is not None and self.limit.down is not None:
            return f"the judge cannot be reached: {self.limit.down}"
        return self.failure

    def observe(self, verdicts: Sequence[Sequence[Verdict]]) -> None:
        steps = [v for vs in verdicts for v in vs]
        if not steps:
            return
        failed = [v for v in steps if v.label is None]
        self.failure = failed[0].error if len(failed) == len(steps) else None

    def status(self) -> str:
        return "degraded" if self.problem() is not None else "ok"


def reward_response(results: Sequence[RewardResult]) -> dict[str, Any]:
    """`/reward`'s answer: a rollout without a reward (a failed check) is `null` in `rewards`,
    and its result says why (`unavailable`)."""
    return {
        "rewards": [None if r.unavailable is not None else r.reward for r in results],
        "results": [r.as_dict() for r in results],
    }
