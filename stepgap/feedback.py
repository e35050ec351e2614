"""Typed feedback to the policy inside a rollout (docs/contract.md, section 2, "Notes").

With `feedback: typed`, a step whose verdict is ready when its retrieval goes back to the
policy has one short note appended to that retrieval: the gap and its repair, in a
`<feedback>` block that segmentation keeps out of claims and evidence, so a trace checked with
its notes is checked as without them. A no-gap step gets no note. `none` (the default) sends
nothing and waits for nothing.
"""

from __future__ import annotations

from typing import Literal

FeedbackMode = Literal["none", "typed"]
FEEDBACK_MODES: tuple[str, ...] = ("none", "typed")

# One line per gap type: what is wrong with the last step, then the repair (schema.REPAIRS).
# None of them holds a retraction cue (reward_arithmetic.RETRACTION_CUES), nor any tag.
NOTE_TEXT: dict[str, str] = {
    "CC": "the last claim is contradicted by the evidence or strays from the question: retract it",
    "IE": "the evidence found is not about what the last claim needs: search again",
    "MB": "the last claim is not yet supported by the evidence: search for the bridging fact",
}


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
