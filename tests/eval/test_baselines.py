"""Baseline checkers: NLI-only with a real (tiny) NLI model, NER-Quote's spaCy stage C."""

from __future__ import annotations

import pytest

from stepgap.data_builders import iter_traces
from stepgap.data_builders.schema import Snippet, Step
from stepgap.eval.baselines import NERQuoteChecker, flag_everything, nli_only
from stepgap.teacher import HFNLI, ReplayJudge, ReplayNLI
from tests.fixtures.models import nli_label_counts


@pytest.fixture(scope="module")
def traces(examples_dir):
    return list(iter_traces(examples_dir / "traces.jsonl"))


def test_nli_only_uses_all_evidence_so_far_and_the_claim(traces, tiny_nli):
    verdicts = list(nli_only(traces, HFNLI(str(tiny_nli))))
    assert len(verdicts) == 28
    t = traces[1]
    v = next(v for v in verdicts if v.trace_id == t.id and v.step == 2)
    (call,) = v.nli
    assert call.hypothesis == t.steps[2].claim
    for step in t.steps[:3]:
        for s in step.evidence:
            assert s.text in call.premise
    assert all((v.label == "no_gap") == (v.nli[0].label == "entailment") for v in verdicts)
    counts = nli_label_counts(verdicts)  # both branches of that rule are taken
    assert counts["entailment"] > 0 and counts["entailment"] < 28, counts
    print("NLI-only labels on the examples:", counts)


def test_flag_everything_flags_every_step(traces):
    vs = list(flag_everything(traces))
    assert (
        len(vs) == 28
        and {v.label for v in vs} == {"IE"}
        and all(v.repair == "re-search" for v in vs)
    )


def test_ner_quote_stage_c_matches_entities_by_token_overlap(examples_dir):
    checker = NERQuoteChecker(
        ReplayJudge.from_file(examples_dir / "judge_replay.jsonl"),
        ReplayNLI.from_file(examples_dir / "nli_replay.jsonl"),
    )
    step = Step(
        index=0, type="inference", claim="Ernst Kuhn was born in Vienna.", query="Ernst Kuhn"
    )
    hit = [
        Snippet(
            title="Ernst Kuhn",
            text="Ernst Kuhn was an Austrian actor. Kuhn was born in Vienna in 1912.",
        )
    ]
    miss = [Snippet(title="Paris", text="Paris is the capital of France.")]
    c = checker.quote_search(step, hit)
    assert c.entity_match and c.found_quote
    assert c.evidence_quote in hit[0].text  # a verbatim sentence, so stage C's check accepts it
    c = checker.quote_search(step, miss)
    assert not c.entity_match and not c.found_quote and c.evidence_quote == ""
