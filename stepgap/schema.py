"""The data contracts of docs/contract.md section 1 as pydantic models.

Every file stepgap reads or writes goes through one of these models, so a malformed record is
rejected with the name of the offending field instead of surfacing later as a wrong label.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

GapLabel = Literal["no_gap", "CC", "IE", "MB"]
StepType = Literal["inference", "conclusion"]
Repair = Literal["none", "retract", "re-search", "bridging-search"]
NLILabel = Literal["entailment", "neutral", "contradiction"]

LABELS: tuple[str, ...] = ("no_gap", "CC", "IE", "MB")
GAP_TYPES: tuple[str, ...] = ("CC", "IE", "MB")
REPAIRS: dict[str, str] = {
    "no_gap": "none",
    "CC": "retract",
    "IE": "re-search",
    "MB": "bridging-search",
}


def to_plain(value: Any) -> Any:
    """A numpy array or scalar (a Parquet column's value, a Ray or veRL batch's) as plain
    Python lists and numbers; anything else as it is."""
    import numpy as np

    return value.tolist() if isinstance(value, np.ndarray | np.generic) else value


class Snippet(BaseModel):
    """One retrieved document: Search-R1's `Doc N(Title: T) text` item."""

    model_config = ConfigDict(extra="forbid")

    title: str = ""
    text: str


class Step(BaseModel):
    """One reasoning step: the text before an action, the action, and what it retrieved."""

    model_config = ConfigDict(extra="allow")

    index: int = Field(ge=0)
    type: StepType
    claim: str
    query: str | None = None
    evidence: list[Snippet] = Field(default_factory=list)
    answer: str | None = None
    span: tuple[int, int] | None = None

    @model_validator(mode="after")
    def _span_ordered(self) -> Step:
        if self.span is not None and not (0 <= self.span[0] <= self.span[1]):
            raise ValueError(f"span must satisfy 0 <= start <= end, got {list(self.span)}")
        return self


class Trace(BaseModel):
    """A question with either a raw `response` or its segmented `steps` (extra keys are kept)."""

    model_config = ConfigDict(extra="allow")

    id: str
    question: str
    golden_answers: list[str] = Field(default_factory=list)
    data_source: str | None = None
    response: str | None = None
    steps: list[Step] | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _id_as_str(cls, value: Any) -> Any:
        # Search-R1 parquet files index rows by integer; ids are strings everywhere else.
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("golden_answers", mode="before")
    @classmethod
    def _wrap_single_answer(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [value]
        return to_plain(value)  # numpy arrays from parquet

    @model_validator(mode="after")
    def _has_content(self) -> Trace:
        if self.response is None and self.steps is None:  # named as the field that is missing
            raise ValidationError.from_exception_data(
                "Trace",
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "missing", "a trace needs a 'response' (raw) or 'steps' (segmented)"
                        ),
                        loc=("response",),
                        input=None,
                    )
                ],
            )
        return self


class AlignmentJudgment(BaseModel):
    """Stage A: does the step target the question's entity and relation?"""

    model_config = ConfigDict(extra="forbid")

    is_off_target: bool
    drift_type: Literal["none", "entity_drift", "relation_drift", "scope_drift"]
    alignment_reasoning: str


class AbstentionJudgment(BaseModel):
    """Stage B: is the step an abstention, and is the abstention grounded in the evidence?"""

    model_config = ConfigDict(extra="forbid")

    is_abstention_step: bool
    abstention_is_accurate: bool
    abstention_reasoning: str


class QuoteSearchJudgment(BaseModel):
    """Stage C: is the evidence about the step's entity, and which verbatim span supports it?"""

    model_config = ConfigDict(extra="forbid")

    entity_match: bool
    entity_match_reasoning: str
    found_quote: bool
    evidence_quote: str
    quote_search_reasoning: str


class Judge(BaseModel):
    """The judge object (stages A-C) of docs/contract.md section 3, exactly; unknown keys are rejected."""

    model_config = ConfigDict(extra="forbid")

    step_minus1_alignment: AlignmentJudgment
    step_0_abstention_check: AbstentionJudgment
    step_1_quote_search: QuoteSearchJudgment


class NLIProbs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    entailment: float
    neutral: float
    contradiction: float


class NLICall(BaseModel):
    """One premise/hypothesis pair sent to the NLI model, with what it answered."""

    model_config = ConfigDict(extra="forbid")

    stage: Literal["D", "E"]
    premise: str
    hypothesis: str
    probs: NLIProbs
    label: NLILabel


class Verdict(BaseModel):
    """The checker's output for one step. A failed check has label None and an error, never no_gap."""

    model_config = ConfigDict(extra="allow")

    trace_id: str
    step: int
    type: StepType
    label: GapLabel | None
    repair: Repair | None
    path: list[str] = Field(default_factory=list)
    confidence: float | None = None
    rationale: str = ""
    judge: Judge | None = None
    judge_confidences: dict[str, float] | None = None
    nli: list[NLICall] = Field(default_factory=list)
    error: str | None = None
    prompt_version: str | None = None
    # What the verdict was decided from, so `stepgap relabel` can re-decide it without models:
    # the question, the step itself, and the NLI calls an ablation would make beyond `nli`.
    question: str | None = None
    step_data: Step | None = None
    nli_extra: list[NLICall] = Field(default_factory=list)
    # Which judge and NLI model decided it ({"judge": {"spec", "note"}, "nli": {...}}); `note`
    # says when it was a stand-in or replayed answers, so reports and model cards can say so.
    checker: dict[str, Any] | None = None
    # The decision tree's configuration that decided it (TreeConfig's fields: ablate,
    # thresholds, hypothesis mode); `relabel` starts from it. None in verdicts written before.
    tree: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _label_or_error(self) -> Verdict:
        if self.label is None and not self.error:
            raise ValueError("a verdict without a label must carry an error")
        if self.label is not None and self.repair != REPAIRS[self.label]:
            raise ValueError(f"repair for {self.label} must be {REPAIRS[self.label]!r}")
        return self


class JudgeRecord(BaseModel):
    """A stored judge answer for replay: which step it judged and the judge object."""

    model_config = ConfigDict(extra="allow")

    trace_id: str
    step: int
    judge: Judge


class NLIRecord(BaseModel):
    """A stored NLI answer for replay, keyed by the exact premise and hypothesis."""

    model_config = ConfigDict(extra="allow")

    premise: str
    hypothesis: str
    probs: NLIProbs


class GoldStep(BaseModel):
    """A human label for one step."""

    model_config = ConfigDict(extra="allow")

    trace_id: str
    step: int
    label: GapLabel


class GoldTrace(BaseModel):
    """Whether a trace's final answer is correct under EM."""

    model_config = ConfigDict(extra="allow")

    trace_id: str
    correct: bool
