"""One tag grammar for every reader: segmentation, the rollout loop and the reward read a tag
in any case and with spaces inside the brackets the same way (docs/contract.md, section 2)."""

from __future__ import annotations

import json

import pytest

from stepgap.data_builders.rollout_formats import Generation, HermesFormat, Rollout, SearchR1Format
from stepgap.reward_arithmetic import final_answer
from stepgap.segment import segment_response
from stepgap.tags import first_block, last_block


def _rollout() -> Rollout:
    return Rollout(item=None, sample=0, trace_id="q", messages=[])


SEARCH = ["<search>{}</search>", "<Search> {} </SEARCH>", "< search >{}</ search >"]
ANSWER = ["<answer>{}</answer>", "<ANSWER>{}</Answer>", "< answer >{}< / answer >"]


@pytest.mark.parametrize("search", SEARCH)
@pytest.mark.parametrize("answer", ANSWER)
def test_segment_rollouts_and_reward_read_the_same_actions(search, answer):
    response = (
        "Find the tower. " + search.format("Eiffel Tower")
        + "<information>Doc 1(Title: Eiffel Tower) It is in Paris.</information>"
        + "So Paris. " + answer.format("Paris")
    )  # fmt: skip
    steps = segment_response(response)
    assert [s.query for s in steps] == ["Eiffel Tower", None]
    assert steps[-1].answer is not None and steps[-1].answer.strip() == "Paris"
    assert final_answer(response, steps).strip() == "Paris"

    turn = "Find the tower. " + search.format("Eiffel Tower")
    r = _rollout()
    SearchR1Format().step(r, Generation(turn, "eos"), last=False)
    assert r.pending_query == "Eiffel Tower" and r.finish is None and r.invalid_turns == 0
    r = _rollout()
    SearchR1Format().step(r, Generation("So Paris. " + answer.format("Paris"), "eos"), last=False)
    assert r.finish == "answer"


def test_hermes_turns_read_tool_calls_and_answers_in_any_case():
    call = json.dumps({"name": "search", "arguments": {"query": "Eiffel Tower"}})
    r = _rollout()
    HermesFormat().step(r, Generation(f"< Tool_Call >{call}</TOOL_CALL>", "eos"), last=False)
    assert r.pending_query == "Eiffel Tower"
    r = _rollout()
    HermesFormat().step(r, Generation("<Answer>Paris</answer>", "eos"), last=False)
    assert r.finish == "answer"


def test_the_first_complete_block_is_the_action_and_the_last_answer_is_final():
    assert first_block("<search>open <answer>a</answer>", ("search", "answer")) == ("answer", "a")
    assert first_block("<SEARCH>x</search><answer>a</answer>", ("search", "answer")) == (
        "search", "x",
    )  # fmt: skip
    assert first_block("no tags", ("search", "answer")) is None
    assert last_block("<answer>a</answer> then <ANSWER> b", "answer") == " b"
    assert last_block("nothing", "answer") is None
