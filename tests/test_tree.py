"""Every branch of the docs/contract.md section 3 decision tree: label, repair and path."""

from __future__ import annotations

import math

import pytest

from stepgap.schema import REPAIRS, Snippet
from stepgap.tree import JudgeResult, TreeConfig, decide_trace, hypothesis_for, quote_in_evidence
from tests.teacher.helpers import TableNLI, conclusion, inference, judge, ok, probs

Q = "Where was the director of Rashomon born?"
EVIDENCE = "Rashomon is a 1950 film directed by Akira Kurosawa."
QUOTE = "directed by Akira Kurosawa"
ENTAIL, NEUTRAL, CONTRA = probs(0.9, 0.05, 0.05), probs(0.2, 0.7, 0.1), probs(0.05, 0.1, 0.85)

A_ON, B_NOT = "stageA:on_target", "stageB:not_abstention"


def one_step(step_judge, *, step_type="inference", nli_probs=NEUTRAL, config=TreeConfig()):
    step = (
        inference(0, "Kurosawa directed it.", EVIDENCE)
        if step_type == "inference"
        else conclusion(0, "Tokyo").model_copy(
            update={"evidence": inference(0, "", EVIDENCE).evidence}
        )
    )
    nli = TableNLI({QUOTE: nli_probs}, default=nli_probs)
    (v,) = decide_trace("t", Q, [step], [ok(step_judge)], nli, config)
    return v, nli


def assert_verdict(v, label, path):
    assert v.label == label
    assert v.repair == REPAIRS[label]
    assert v.path == path
    assert v.error is None


@pytest.mark.parametrize("step_type", ["inference", "conclusion"])
@pytest.mark.parametrize("drift", ["entity_drift", "relation_drift", "scope_drift"])
def test_stage_a_off_target_is_cc(step_type, drift):
    v, nli = one_step(judge(off=True, drift=drift), step_type=step_type)
    assert_verdict(v, "CC", [f"stageA:off_target:{drift}"])
    assert nli.asked == [] and v.nli == []


@pytest.mark.parametrize("step_type", ["inference", "conclusion"])
def test_stage_b_grounded_abstention_is_no_gap(step_type):
    v, _ = one_step(judge(abstain=True, accurate=True), step_type=step_type)
    assert_verdict(v, "no_gap", [A_ON, "stageB:grounded_abstention"])


@pytest.mark.parametrize("step_type", ["inference", "conclusion"])
def test_stage_b_wrong_abstention_is_cc(step_type):
    v, _ = one_step(judge(abstain=True, accurate=False), step_type=step_type)
    assert_verdict(v, "CC", [A_ON, "stageB:wrong_abstention"])


@pytest.mark.parametrize("step_type", ["inference", "conclusion"])
def test_stage_c_entity_mismatch_is_ie(step_type):
    v, nli = one_step(judge(entity=False, found=True, quote=QUOTE), step_type=step_type)
    assert_verdict(v, "IE", [A_ON, B_NOT, "stageC:entity_mismatch"])
    assert nli.asked == []


@pytest.mark.parametrize("step_type", ["inference", "conclusion"])
@pytest.mark.parametrize(
    "nli_probs, label, token",
    [(ENTAIL, "no_gap", "entailment"), (NEUTRAL, "MB", "neutral"), (CONTRA, "CC", "contradiction")],
)
def test_stage_d_local_entailment(step_type, nli_probs, label, token):
    v, nli = one_step(judge(found=True, quote=QUOTE), step_type=step_type, nli_probs=nli_probs)
    assert_verdict(v, label, [A_ON, B_NOT, "stageC:quote", f"stageD:{token}"])
    (call,) = v.nli
    assert call.stage == "D" and call.premise == QUOTE and call.label == token
    expected_h = (
        "Kurosawa directed it." if step_type == "inference" else f'The answer to "{Q}" is Tokyo.'
    )
    assert call.hypothesis == expected_h


def test_quote_matching_ignores_case_and_whitespace_only():
    v, _ = one_step(judge(found=True, quote="  DIRECTED   by\nakira kurosawa "), nli_probs=ENTAIL)
    assert v.path[-2:] == ["stageC:quote", "stageD:entailment"]
    assert quote_in_evidence("film directed", inference(0, "", EVIDENCE).evidence)
    assert not quote_in_evidence("directed by Kurosawa", inference(0, "", EVIDENCE).evidence)


@pytest.mark.parametrize(
    "j, token",
    [
        (judge(found=True, quote="directed by Kurosawa Akira"), "stageC:quote_not_verbatim"),
        (judge(found=False, quote=""), "stageC:no_quote"),
        (judge(found=True, quote="   "), "stageC:no_quote"),
        (judge(found=False, quote=QUOTE), "stageC:no_quote"),
    ],
)
def test_inference_without_verified_quote_is_no_gap(j, token):
    v, nli = one_step(j)
    assert_verdict(v, "no_gap", [A_ON, B_NOT, token])
    assert nli.asked == []


def _conclusion_trace(earlier_entity: list[bool], conclusion_judge, table):
    steps = [inference(i, f"claim {i}", f"snippet {i}") for i in range(len(earlier_entity))]
    steps.append(conclusion(len(steps), "Tokyo"))
    judged = [ok(judge(entity=e)) for e in earlier_entity] + [ok(conclusion_judge)]
    nli = TableNLI(table)
    return decide_trace("t", Q, steps, judged, nli, TreeConfig()), nli


def test_stage_e_entailed_by_an_entity_matched_earlier_snippet():
    verdicts, nli = _conclusion_trace(
        [True, False, True], judge(found=False), {"snippet 0": NEUTRAL, "snippet 2": ENTAIL}
    )
    v = verdicts[-1]
    assert_verdict(v, "no_gap", [A_ON, B_NOT, "stageC:no_quote", "stageE:entailed"])
    # Premises: entity-matched earlier snippets only, in step order (snippet 1 is excluded).
    assert [c.premise for c in v.nli] == ["snippet 0", "snippet 2"]
    assert all(c.stage == "E" for c in v.nli)
    assert math.isclose(v.confidence, ENTAIL.entailment)


def test_stage_e_not_entailed_is_ie():
    verdicts, _ = _conclusion_trace(
        [True], judge(found=True, quote="not in any snippet"), {"snippet 0": CONTRA}
    )
    assert_verdict(
        verdicts[-1], "IE", [A_ON, B_NOT, "stageC:quote_not_verbatim", "stageE:not_entailed"]
    )


def test_stage_e_with_no_premises_is_ie():
    verdicts, nli = _conclusion_trace([False, False], judge(found=False), {})
    assert_verdict(verdicts[-1], "IE", [A_ON, B_NOT, "stageC:no_quote", "stageE:no_premises"])
    assert nli.asked == []


def test_stage_e_pool_excludes_steps_that_stopped_before_stage_c():
    steps = [
        inference(0, "c0", "snippet 0"),
        inference(1, "c1", "snippet 1"),
        conclusion(2, "Tokyo"),
    ]
    judged = [ok(judge(off=True, drift="entity_drift")), ok(judge()), ok(judge())]
    verdicts = decide_trace("t", Q, steps, judged, TableNLI({}), TreeConfig())
    assert [c.premise for c in verdicts[-1].nli] == ["snippet 1"]


def test_ablate_a_skips_alignment():
    v, _ = one_step(
        judge(off=True, drift="entity_drift", found=True, quote=QUOTE),
        nli_probs=ENTAIL,
        config=TreeConfig(ablate="A"),
    )
    assert_verdict(v, "no_gap", [B_NOT, "stageC:quote", "stageD:entailment"])


def test_ablate_e_labels_quoteless_conclusion_ie_directly():
    v, nli = one_step(judge(found=False), step_type="conclusion", config=TreeConfig(ablate="E"))
    assert_verdict(v, "IE", [A_ON, B_NOT, "stageC:no_quote"])
    assert nli.asked == []
    # An inference step is unaffected by -E.
    v, _ = one_step(judge(found=False), config=TreeConfig(ablate="E"))
    assert_verdict(v, "no_gap", [A_ON, B_NOT, "stageC:no_quote"])


def test_thresholds_are_configurable():
    p = probs(0.6, 0.3, 0.1)
    v, _ = one_step(judge(found=True, quote=QUOTE), nli_probs=p)
    assert v.label == "no_gap"
    v, _ = one_step(
        judge(found=True, quote=QUOTE), nli_probs=p, config=TreeConfig(entail_threshold=0.7)
    )
    assert v.label == "MB"
    v, _ = one_step(
        judge(found=True, quote=QUOTE),
        nli_probs=probs(0.2, 0.4, 0.4),
        config=TreeConfig(contradict_threshold=0.35),
    )
    assert v.label == "CC"


def test_confidence_is_geometric_mean_of_deciding_stages():
    step = inference(0, "Kurosawa directed it.", EVIDENCE)
    res = ok(judge(found=True, quote=QUOTE), A=0.9, B=0.8, C=0.5)
    (v,) = decide_trace("t", Q, [step], [res], TableNLI({QUOTE: ENTAIL}), TreeConfig())
    assert math.isclose(v.confidence, (0.9 * 0.8 * 0.5 * 0.9) ** 0.25)
    assert v.judge_confidences == {"A": 0.9, "B": 0.8, "C": 0.5}


def test_failed_judge_gives_error_verdict_never_a_label():
    steps = [inference(0, "c", EVIDENCE), conclusion(1, "Tokyo")]
    judged = [JudgeResult.failed("schema violation"), ok(judge(found=False))]
    verdicts = decide_trace("t", Q, steps, judged, TableNLI({}), TreeConfig())
    assert verdicts[0].label is None and verdicts[0].repair is None
    assert verdicts[0].error == "schema violation"
    assert verdicts[1].label == "IE"  # the failed step contributes no premises


def test_hypothesis_modes():
    step = conclusion(0, "Tokyo", claim="So it is Tokyo.")
    assert hypothesis_for(step, Q) == f'The answer to "{Q}" is Tokyo.'
    assert hypothesis_for(step, Q, "answer") == "Tokyo"
    assert hypothesis_for(step, Q, "claim") == "So it is Tokyo."
    assert hypothesis_for(inference(0, "c", "e"), Q, "answer") == "c"


def test_bad_config_is_rejected():
    with pytest.raises(ValueError):
        TreeConfig(ablate="C")
    with pytest.raises(ValueError):
        TreeConfig(entail_threshold=0)


def test_every_path_token_the_tree_writes_is_in_path_tokens():
    """The student's constrained vocabulary (PATH_TOKENS) covers every branch, and no more."""
    import itertools

    from stepgap.tree import PATH_TOKENS

    seen: set[str] = set()
    for off, drift, abstain, accurate, entity, found, quote, step_type, nli_probs in (
        itertools.product(
            [False, True], ["none", "entity_drift", "relation_drift", "scope_drift"],
            [False, True], [False, True], [False, True], [False, True],
            [QUOTE, "not in the evidence at all"], ["inference", "conclusion"],
            [ENTAIL, NEUTRAL, CONTRA],
        )
    ):  # fmt: skip
        step_judge = judge(
            off=off, drift=drift, abstain=abstain, accurate=accurate, entity=entity,
            found=found, quote=quote,
        )  # fmt: skip
        v, _ = one_step(step_judge, step_type=step_type, nli_probs=nli_probs)
        seen.update(v.path)
    # stage E with premises needs an earlier entity-matched step
    earlier = inference(0, "Kurosawa directed it.", EVIDENCE)
    final = conclusion(1, "Tokyo")
    for p in (ENTAIL, NEUTRAL):
        nli = TableNLI({}, default=p)
        vs = decide_trace("t", Q, [earlier, final], [ok(judge()), ok(judge())], nli)
        seen.update(vs[1].path)
    assert seen == set(PATH_TOKENS)
    assert len(PATH_TOKENS) == len(set(PATH_TOKENS))


# ---- the readings fixed after review (docs/contract.md, "Fixed reading") ----


def test_a_quote_must_lie_inside_one_snippets_text():
    two = [
        Snippet(title="Akira Kurosawa", text="Rashomon is a 1950 film"),
        Snippet(title="T", text="directed by Akira Kurosawa."),
    ]
    assert quote_in_evidence("directed by Akira Kurosawa", two)
    assert not quote_in_evidence("1950 film directed by", two)  # across two snippets
    assert not quote_in_evidence("Akira Kurosawa Rashomon", two)  # title + text
    step = inference(0, "Kurosawa directed it.").model_copy(update={"evidence": two})
    nli = TableNLI({}, default=ENTAIL)
    (v,) = decide_trace("t", Q, [step], [ok(judge(found=True, quote="Akira Kurosawa"))], nli)
    assert v.path[-2:] == ["stageC:quote", "stageD:entailment"]  # in a text: fine
    (v,) = decide_trace(
        "t", Q, [step], [ok(judge(found=True, quote="Akira Kurosawa Rashomon"))], nli
    )
    assert v.path[-1] == "stageC:quote_not_verbatim" and v.nli == []  # a title never counts


def test_stage_d_premise_is_the_quote_as_given_and_stage_e_premise_the_text_alone():
    v, _ = one_step(judge(found=True, quote="  DIRECTED by akira Kurosawa "), nli_probs=ENTAIL)
    assert v.nli[0].premise == "  DIRECTED by akira Kurosawa "  # matched folded, sent as given
    verdicts, _ = _conclusion_trace([True], judge(found=False), {"snippet 0": ENTAIL})
    assert [c.premise for c in verdicts[-1].nli] == ["snippet 0"]  # no "T: " title prefix


def test_entailment_is_tested_before_contradiction():
    v, _ = one_step(judge(found=True, quote=QUOTE), nli_probs=probs(0.5, 0.0, 0.5))
    assert v.label == "no_gap" and v.nli[0].label == "entailment"
