"""stepgap/feedback.py: the typed note, and that a trace with notes segments as without them."""

from __future__ import annotations

import pytest

from stepgap.feedback import NOTE_TEXT, check_mode, note_for
from stepgap.reward_arithmetic import RETRACTION_CUES
from stepgap.schema import GAP_TYPES, REPAIRS
from stepgap.segment import segment_response
from stepgap.tags import TAG


def _content(steps):
    return [(s.type, s.claim, s.query, s.answer, s.evidence) for s in steps]


@pytest.mark.parametrize("label", GAP_TYPES)
def test_a_gap_gets_one_note_naming_it_and_no_gap_gets_none(label):
    note = note_for(label)
    assert note.startswith("<feedback>") and note.endswith(f"({label})</feedback>")
    inner = note.removeprefix("<feedback>").removesuffix("</feedback>")
    assert not TAG.search(inner) and "\n" not in inner
    assert not RETRACTION_CUES.search(inner)  # never read as a retraction
    assert note_for("no_gap") is None
    assert set(NOTE_TEXT) == set(REPAIRS) - {"no_gap"}
    with pytest.raises(ValueError, match="no note for the label 'XX'"):
        note_for("XX")
    with pytest.raises(ValueError, match="feedback must be one of none, typed"):
        check_mode("loud")


SEARCH_R1 = (
    'Who directed it? <search>film director</search><information>Doc 1(Title: "Film") It was '
    "directed by Ann Lee.</information>{note} Ann Lee directed it. <search>Ann Lee born"
    "</search><information>Doc 1(Title: Ann Lee) Born in Taipei.</information>{note} "
    "<answer>Taipei</answer>"
)
HERMES = (
    'She looks. <tool_call>{{"name": "search", "arguments": {{"query": "film director"}}}}'
    "</tool_call><tool_response>Doc 1(Title: Film) directed by Ann Lee.{note}</tool_response>"
    " So Taipei. <answer>Taipei</answer>"
)


@pytest.mark.parametrize("label", GAP_TYPES)
@pytest.mark.parametrize("response", [SEARCH_R1, HERMES], ids=["search_r1", "hermes"])
def test_a_note_after_or_inside_the_retrieval_is_neither_claim_nor_evidence(response, label):
    """Search-R1's notes follow `</information>`; a tool loop's sit inside its tool response:
    either way the steps are those of the response without notes (only the spans move)."""
    plain = segment_response(response.format(note=""))
    noted = segment_response(response.format(note=note_for(label)))
    assert _content(noted) == _content(plain)
    assert len(noted) == len(plain) >= 2
    assert all("feedback" not in s.claim and label not in s.claim for s in noted)


def test_a_note_before_any_step_is_dropped_too():
    response = "{note}Plain claim. <answer>x</answer>"
    noted = segment_response(response.format(note=note_for("CC")))
    assert _content(noted) == _content(segment_response(response.format(note="")))


def test_a_feedback_tag_the_model_writes_itself_is_its_claim_not_a_note():
    """Only stepgap's own notes are dropped: a policy that wraps its claim in `<feedback>`
    gets it checked as the claim it is (after an action, and after the evidence)."""
    for own in ("<feedback>Ann Lee was born in Paris.</feedback>",
                "<feedback>the last claim is fine (MB)</feedback>"):  # fmt: skip
        text = SEARCH_R1.format(note=own)
        plain = SEARCH_R1.format(note=own.removeprefix("<feedback>").removesuffix("</feedback>"))
        steps = segment_response(text)
        assert _content(steps) == _content(segment_response(plain))
        inner = own.removeprefix("<feedback>").removesuffix("</feedback>")
        assert inner in steps[1].claim and inner in steps[2].claim
        evidence = [e.text for s in steps for e in s.evidence]
        assert not any(inner in e for e in evidence)
