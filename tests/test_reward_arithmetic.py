"""docs/contract.md section 4 on hand-computed traces: every shaping case, first case wins, boundaries."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepgap.reward_arithmetic import (
    compute_reward,
    exact_match,
    final_answer,
    is_near_duplicate,
    is_retraction,
    normalize_answer,
    token_f1,
)
from stepgap.schema import REPAIRS, Step, Trace, Verdict


def search(i: int, query: str, claim: str = "I need to look this up.") -> Step:
    return Step(index=i, type="inference", claim=claim, query=query, evidence=[])


def answer(i: int, ans: str, claim: str = "So the answer is clear.") -> Step:
    return Step(index=i, type="conclusion", claim=claim, answer=ans, evidence=[])


def trace(steps: list[Step], golden=("Paris",), response=None) -> Trace:
    return Trace(id="t", question="q?", golden_answers=list(golden), steps=steps, response=response)


def verdicts(labels: list[str | None]) -> list[Verdict]:
    return [
        Verdict(
            trace_id="t",
            step=i,
            type="inference",
            label=lab,
            repair=REPAIRS[lab] if lab else None,
            error=None if lab else "judge failed",
        )  # fmt: skip
        for i, lab in enumerate(labels)
    ]


def brackets(t: Trace, labels: list[str | None], variant: str = "typed_shape"):
    r = compute_reward(t, verdicts(labels), variant=variant)
    return [(s.base, s.shape, s.bracket) for s in r.steps], r


def test_case1_research_after_ie_or_mb_earns_plus_0_10():
    t = trace([search(0, "birthplace of ernst kuhn"), search(1, "pertramer film director")])
    rows, _ = brackets(t, ["IE", "no_gap"])
    assert rows == [(-0.10, 0.0, -0.10), (0.20, 0.10, pytest.approx(0.30))]
    rows, _ = brackets(t, ["MB", "MB"])
    assert rows[1] == (-0.05, 0.10, pytest.approx(0.05))


def test_case2_retraction_after_cc_earns_plus_0_15():
    t = trace([
        search(0, "q one", claim="Kuhn was born in Berlin in 1912."),
        search(1, "q two", claim="Actually, the record says Vienna; I misread the first snippet."),
    ])  # fmt: skip
    rows, _ = brackets(t, ["CC", "no_gap"])
    assert rows[1] == (0.20, 0.15, pytest.approx(0.35))


def test_case3_answering_over_an_open_gap_costs_0_15():
    for prev in ("IE", "MB", "CC"):
        t = trace([search(0, "q"), answer(1, "Paris")])
        rows, _ = brackets(t, [prev, "no_gap"])
        assert rows[1] == (0.20, -0.15, pytest.approx(0.05)), prev


def test_case4_near_duplicate_research_costs_0_05():
    t = trace([search(0, "where was ernst kuhn born"), search(1, "where was ernst kuhn born?")])
    rows, _ = brackets(t, ["IE", "IE"])
    assert rows[1] == (-0.10, -0.05, pytest.approx(-0.15))


def test_case5_otherwise_zero_and_first_step_looks_back_at_no_gap():
    t = trace([search(0, "a"), search(1, "b"), answer(2, "Paris")])
    rows, _ = brackets(t, ["no_gap", "no_gap", "no_gap"])
    assert [s for _, s, _ in rows] == [0.0, 0.0, 0.0]
    rows, _ = brackets(trace([answer(0, "Paris")]), ["CC"])  # t_0 is no_gap: no case 3
    assert rows == [(0.05, 0.0, 0.05)]


def test_first_case_wins_retraction_before_answer_penalty():
    # A conclusion after CC whose claim retracts: case 2 (+0.15) fires before case 3 (-0.15).
    t = trace([
        search(0, "q", claim="Kuhn directed Pertramer's film."),
        answer(1, "Paris", claim="Wait, I was wrong: the evidence names Paris instead."),
    ])  # fmt: skip
    r = compute_reward(t, verdicts(["CC", "no_gap"]))
    assert (r.steps[1].shape, r.steps[1].shape_case) == (0.15, 2)


def test_the_repair_rate_counts_the_steps_after_a_gap_that_made_its_repair():
    """Steps after a gap: a new search after MB (case 1), a retraction after CC (case 2), a
    near-duplicate search after IE (case 4) and an answer over an open MB (case 3): two of
    four repaired, under every variant (the variant changes the reward, not what was done)."""
    t = trace([
        search(0, "who directed pertramer", claim="Kuhn was born in Berlin."),
        search(1, "birthplace of ernst kuhn", claim="I need the director first."),
        search(2, "q three", claim="Kuhn was born in Graz."),
        search(3, "q four", claim="Actually, I misread it: the record says Vienna, not Graz."),
        search(4, "where was ernst kuhn born"),
        search(5, "where was ernst kuhn born?"),
        answer(6, "Vienna"),
    ])  # fmt: skip
    labels = ["no_gap", "MB", "CC", "no_gap", "IE", "MB", "no_gap"]
    for variant in ("typed_shape", "typed_base", "binary_gap"):
        scalars = compute_reward(t, verdicts(labels), variant=variant).scalars()
        assert (scalars["repair_chances"], scalars["repair_rate"]) == (4.0, 0.5), variant
    assert compute_reward(t, verdicts(["no_gap"] * 7)).scalars()["repair_rate"] == 0.0


def test_near_duplicate_boundary_f1_exactly_0_7_is_not_a_duplicate():
    earlier = "a1 a2 a3 a4 a5 a6 a7 x1 x2 x3"  # 10 tokens, 7 shared with the query
    query = "a1 a2 a3 a4 a5 a6 a7 y1 y2 y3"
    assert token_f1(query, earlier) == pytest.approx(0.7)
    assert not is_near_duplicate(query, [earlier])
    assert is_near_duplicate("a1 a2 a3 a4 a5 a6 a7 a8 y2 y3", ["a1 a2 a3 a4 a5 a6 a7 a8 x2 x3"])
    t = trace([search(0, earlier), search(1, query)])
    assert brackets(t, ["IE", "IE"])[0][1][1] == 0.10  # case 1, not case 4


@pytest.mark.parametrize(
    ("claim", "cue"),
    [
        ("Actually, it was Vienna.", True),
        ("WAIT - the snippet says Vienna.", True),
        ("Correction: Vienna, not Berlin.", True),
        ("I was wrong about Berlin; it is Vienna.", True),
        ("He awaits the verdict in Vienna.", False),  # word-bounded: 'awaits' is no cue
        ("The actuality of Vienna.", False),
        ("It was Vienna.", False),
    ],
)
def test_retraction_cues_are_word_bounded_and_case_insensitive(claim, cue):
    assert is_retraction(claim, "Kuhn was born in Berlin in 1912.") is cue


def test_retraction_needs_a_changed_claim():
    previous = "Kuhn was born in Berlin in 1912 according to the record."
    assert not is_retraction(
        "Actually Kuhn was born in Berlin in 1912 according to the record.", previous
    )


def test_em_normalisation_and_last_answer():
    assert normalize_answer("  The Eiffel-Tower! ") == "eiffeltower"
    assert normalize_answer("An Apple a day") == "apple day"
    assert exact_match("the  Paris.", ["paris"]) == 1.0
    assert exact_match("Paris, France", ["Paris"]) == 0.0
    assert exact_match(None, ["Paris"]) == 0.0
    response = "<answer>Berlin</answer> hmm <answer>The Paris</answer>"
    assert final_answer(response, []) == "The Paris"


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("<answer>Berlin</answer>...<Answer>Paris</Answer>", "Paris"),  # any letter case
        ("<answer>Berlin</answer> then <ANSWER> Paris", " Paris"),  # unclosed: to the end
        ("< answer >Rome</ answer >", "Rome"),  # spaces inside the tags
        ("no tags at all", None),
    ],
)
def test_em_reads_the_last_answer_tag_in_any_case_and_unclosed(response, answer):
    assert final_answer(response, []) == answer
    expected = 1.0 if answer and answer.strip() in ("Paris", "Rome") else 0.0
    assert exact_match(final_answer(response, []), ["Paris", "Rome"]) == expected


def test_each_variant_on_one_trace():
    steps = [search(0, "first query"), search(1, "second query"), answer(2, "Paris")]
    t = trace(steps, response="<search>x</search><answer>Paris</answer>")
    labels = ["IE", "no_gap", "no_gap"]
    expect = {
        "search_only": 1.0,
        "binary_gap": 1.0 + 0.0 + 0.20 + 0.20,
        "typed_base": 1.0 - 0.10 + 0.20 + 0.20,
        "typed_shape": 1.0 - 0.10 + (0.20 + 0.10) + 0.20,
        "untyped_dense": 1.0 - 0.10 + 0.20 + 0.20,
    }
    for variant, value in expect.items():
        r = compute_reward(t, verdicts(labels), variant=variant, lam=1.0)
        assert r.em == 1.0 and r.reward == pytest.approx(value), variant
    r = compute_reward(t, verdicts(labels), variant="typed_shape", lam=0.5)
    assert r.reward == pytest.approx(1.0 + 0.5 * (-0.10 + 0.30 + 0.20))
    assert compute_reward(t, [], variant="search_only").reward == 1.0
    with pytest.raises(ValueError, match="no verdict"):
        compute_reward(t, [], variant="typed_shape")
    with pytest.raises(ValueError, match="unknown reward variant"):
        compute_reward(t, verdicts(labels), variant="typed")


def test_a_failed_check_earns_nothing_and_shapes_nothing():
    t = trace([search(0, "q1"), search(1, "q2")])
    rows, _ = brackets(t, [None, "no_gap"])
    assert rows == [(0.0, 0.0, 0.0), (0.20, 0.0, 0.20)]


def test_a_trace_with_a_failed_check_has_no_reward_unless_zero_is_chosen():
    """No number passed off as the typed reward: `reward` is None and `unavailable` says how
    many checks failed and the first error; `on_failed_check="zero"` is the old reading."""
    steps = [search(0, "q1"), search(1, "q2"), answer(2, "Paris")]
    t = trace(steps, response="<answer>Paris</answer>")
    vs = verdicts(["no_gap", None, None])
    vs[2] = vs[2].model_copy(update={"error": "judge timed out"})
    r = compute_reward(t, vs[::-1])  # any order: the first failed step's error is named
    assert r.reward is None and r.failed_checks == 2
    assert r.unavailable == "2 of 3 step check(s) failed (first: judge failed)"
    assert r.as_dict()["reward"] is None and "score" not in r.scalars()
    zero = compute_reward(t, vs, on_failed_check="zero")
    assert zero.unavailable is None and zero.reward == pytest.approx(1.0 + 0.20)
    assert compute_reward(t, verdicts([None] * 3), on_failed_check="zero").reward == 1.0
    # search_only reads no check: a failed one takes nothing away
    assert compute_reward(t, vs, variant="search_only").reward == 1.0
    with pytest.raises(ValueError, match="on_failed_check must be one of no_reward, zero"):
        compute_reward(t, vs, on_failed_check="skip")
    with pytest.raises(ValueError, match="either a number or None"):
        dataclasses.replace(r, unavailable=None)


def test_a_failed_step_counts_as_no_gap_for_the_next_steps_shaping():
    """After IE, a failed check, then an answer: the answer's shaping reads the failed step as
    no_gap (0), not the last label that was checked (IE: -0.15 for answering over a gap), and
    the failed search itself earns neither its base nor the +0.10 of searching after IE."""
    t = trace([search(0, "q1"), search(1, "q2"), answer(2, "x")])
    rows, _ = brackets(t, ["IE", None, "no_gap"])
    assert rows == [(-0.10, 0.0, -0.10), (0.0, 0.0, 0.0), (0.20, 0.0, 0.20)]
    rows, _ = brackets(t, ["IE", "no_gap", "no_gap"])  # checked, the same steps shape
    assert rows == [(-0.10, 0.0, -0.10), (0.20, 0.10, 0.30), (0.20, 0.0, 0.20)]
    rows, _ = brackets(t, ["CC", None, "no_gap"])
    assert rows[2] == (0.20, 0.0, 0.20)  # CC before a failed step: no -0.15 either


LABELS = st.sampled_from(["no_gap", "CC", "IE", "MB", None])
WORDS = st.lists(
    st.sampled_from(["actually", "wait", "kuhn", "vienna", "born", "the", "film"]), max_size=6
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(LABELS, st.booleans(), WORDS, WORDS), min_size=1, max_size=8), st.sampled_from(
    ["binary_gap", "typed_base", "typed_shape", "untyped_dense"]))  # fmt: skip
def test_every_bracket_lies_in_the_spec_range(rows, variant):
    steps = []
    for i, (_, is_answer, q, c) in enumerate(rows):
        claim = " ".join(c)
        steps.append(answer(i, "x", claim) if is_answer else search(i, " ".join(q) or "q", claim))
    r = compute_reward(trace(steps), verdicts([lab for lab, *_ in rows]), variant=variant)
    assert all(-0.25 - 1e-12 <= s.bracket <= 0.35 + 1e-12 for s in r.steps)


def test_dense_form_token_spans_cover_each_step(examples_dir):
    from stepgap.segment import iter_traces
    from tests.fixtures.models import qwen_tokenizer

    tok = qwen_tokenizer()
    t = next(iter(iter_traces(examples_dir / "traces.jsonl")))
    vs = [
        Verdict(trace_id=t.id, step=s.index, type=s.type, label="no_gap", repair="none")
        for s in t.steps
    ]
    r = compute_reward(t, vs, tokenizer=tok)
    ids = tok(t.response, add_special_tokens=False)["input_ids"]
    assert r.em_token == len(ids) - 1
    for s, step in zip(r.steps, t.steps, strict=True):
        first, last = s.token_span
        text = tok.decode(ids[first:last])
        start, end = step.span
        assert t.response[start:end].strip()[:20] in text


def test_split_at_puts_each_steps_share_on_the_turn_that_holds_it():
    """Turns end at characters 10, 30 and 35 of the response: a step ending at 10 is the first
    turn's, one ending at 25 the second's, one past the last end and one without a span the
    last turn's; EM is on the last turn. The pieces add up to the reward."""
    steps = [search(0, "q1"), search(1, "q2"), answer(2, "Paris"), search(3, "q3")]
    for step, span in zip(steps, [(0, 10), (12, 25), (26, 40), None], strict=True):
        step.span = list(span) if span else None
    t = trace(steps, response="<answer>Paris</answer>")
    r = compute_reward(t, verdicts(["IE", "no_gap", "no_gap", "MB"]), lam=0.5)
    b = [s.bracket for s in r.steps]
    pieces = r.split_at([10, 30, 35])
    assert pieces == pytest.approx([0.5 * b[0], 0.5 * b[1], 0.5 * (b[2] + b[3]) + r.em])
    assert sum(pieces) == pytest.approx(r.reward, abs=1e-12)
    assert r.split_at([100]) == pytest.approx([r.reward])
    with pytest.raises(ValueError, match="in order"):
        r.split_at([30, 10])
    failed = compute_reward(t, verdicts(["IE", None, "no_gap", "MB"]))
    with pytest.raises(ValueError, match="has no reward"):
        failed.split_at([10, 30])
