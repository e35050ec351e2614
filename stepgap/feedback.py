"""Typed feedback to the policy inside a rollout (docs/contract.md, section 2, "Notes").

With `feedback: typed`, a step whose verdict is ready when its retrieval goes back to the
policy has one short note appended to that retrieval: the gap and its repair, in a
`<feedback>` block that segmentation keeps out of claims and evidence, so a trace checked with
its notes is checked as without them. A no-gap step gets no note. `none` (the default) sends
nothing and waits for nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

from stepgap.tags import NOTE_TEXT

FeedbackMode = Literal["none", "typed"]
FEEDBACK_MODES: tuple[str, ...] = ("none", "typed")

# The repair of a gap as an instruction for the step that is yet to be written (`stepgap
# repairs` regenerates a gap step from the text before it, with this instruction).
REPAIR_TEXT: dict[str, str] = {
    "CC": "the next step must not state what the evidence contradicts nor stray from the "
    "question: retract a claim that is wrong",
    "IE": "the next step needs evidence about what its claim needs: search for it",
    "MB": "the next step must not claim more than the evidence says: search for the bridging "
    "fact first",
}


def instruction_for(label: str) -> str:
    """The repair of a `label` gap as an instruction for the next step, in the tag the policy
    reads notes in. It is shown to the policy only, never written into a trace (where, not
    being one of the notes, it would read as the model's own text)."""
    if label not in REPAIR_TEXT:
        raise ValueError(f"no repair for the label {label!r}; gaps are CC, IE, MB")
    return f"<feedback>{REPAIR_TEXT[label]} ({label})</feedback>"


def note_for(label: str) -> str | None:
    """The note a step labelled `label` gets (`<feedback>TEXT (LABEL)</feedback>`), or None for
    a step without a gap."""
    if label == "no_gap":
        return None
    if label not in NOTE_TEXT:
        raise ValueError(f"no note for the label {label!r}; labels are no_gap, CC, IE, MB")
    return f"<feedback>{NOTE_TEXT[label]} ({label})</feedback>"


def check_mode(mode: str) -> str:
    """`mode`, or a ValueError naming the modes."""
    if mode not in FEEDBACK_MODES:
        raise ValueError(f"feedback must be one of {', '.join(FEEDBACK_MODES)}, not {mode!r}")
    return mode


@dataclass(frozen=True)
class Told:
    """What one retrieval's turn told the policy: its note (None: no gap, or not in time),
    whether the step's verdict came too late for it, the seconds the rollout waited, and how
    many of the text's steps were new (sent for checking by this call)."""

    note: str | None = None
    late: bool = False
    waited: float = 0.0
    new_steps: int = 0


class FeedbackSource(ABC):
    """Where a rollout loop gets its typed notes: a checker of the rollout's steps as they come
    (`stepgap.serving.inline`: a `StreamingReward` in this process, or `stepgap serve`). Async,
    as the agent loops of veRL and OpenRLHF are; `stepgap rollouts` asks for a wave's notes at
    once."""

    @abstractmethod
    async def tell(self, trace_id: str, question: str, text: str, wait: float = 0.0) -> Told:
        """Check the complete steps of the rollout's text so far; the note for the newest one
        if its verdict comes within `wait` seconds and is a gap. Never fails the rollout: a
        step that could not be sent is checked at the end instead (`Told()`)."""

    @abstractmethod
    async def drop(self, trace_id: str) -> None:
        """Forget a rollout whose reward will never be asked here (it ended, or was
        abandoned)."""


def feedback_counts(told: list[Told]) -> dict[str, float]:
    """A rollout's typed feedback as its logs keep it: notes sent, verdicts that came too
    late, seconds waited."""
    return {
        "notes": sum(t.note is not None for t in told),
        "too_late": sum(t.late for t in told),
        "waited_s": round(sum(t.waited for t in told), 3),
    }


def feedback_logs(told: list[Told], mode: str) -> dict[str, float]:
    """A rollout's typed feedback as agent loops log it (`feedback/notes`, ...); nothing with
    feedback off."""
    if mode != "typed":
        return {}
    return {f"feedback/{k}": v for k, v in feedback_counts(told).items()}
