"""Baseline checkers: NLI-only with a real (tiny) NLI model, NER-Quote's spaCy stage C."""

from __future__ import annotations

import pytest

from stepgap.eval.baselines import NERQuoteChecker, flag_everything, nli_only
from stepgap.schema import Snippet, Step
from stepgap.segment import iter_traces
from stepgap.teacher import HFNLI, ReplayJudge, ReplayNLI
from stepgap.teacher.nli.base import NLIBackend
from tests.fixtures.models import build_deberta_nli, nli_label_counts


@pytest.fixture(scope="module")
def traces(examples_dir):
    return list(iter_traces(examples_dir / "traces.jsonl"))


def _entailing_half(tiny_nli, traces, folder):
    """The stand-in with its entailment logit raised so that half the examples' NLI-only calls
    entail: both branches of the baseline's rule are then taken, whatever the stand-in learned
    (its entailment probabilities on these long premises sit just under 0.5)."""
    import math
    import statistics

    first = [v.nli[0].probs.entailment for v in nli_only(traces, HFNLI(str(tiny_nli)))]
    median = statistics.median(first)
    bias = math.log((1 - median) / median)  # moves the median call onto the 0.5 threshold
    return build_deberta_nli(folder, permute_from=tiny_nli, class_bias={"entailment": bias})


def test_nli_only_uses_all_evidence_so_far_and_the_claim(traces, tiny_nli, tmp_path):
    verdicts = list(nli_only(traces, HFNLI(str(_entailing_half(tiny_nli, traces, tmp_path)))))
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


# ---------------------------------------------------------------- LLM-Strict and LLM-Only


def _answer(
    a="on_target", b="not_abstention", c="entity_match", d="entailed", e="not_applicable",
    gap_type="no_gap", confidence=0.1,
) -> dict:  # fmt: skip
    """A scripted prompt-only answer: every stage passes unless told otherwise."""
    return {
        "stage_a_alignment": {"reasoning": "A", "signal": a},
        "stage_b_abstention": {"reasoning": "B", "signal": b},
        "stage_c_entity": {"reasoning": "C", "signal": c, "evidence_quote": ""},
        "stage_d_entailment": {"reasoning": "D", "signal": d},
        "stage_e_cross_step": {"reasoning": "E", "signal": e},
        "gap_type": gap_type,
        "gap_confidence": confidence,
    }


@pytest.mark.parametrize(
    ("step_type", "answer", "strict", "only"),
    [
        ("inference", _answer(), "no_gap", "no_gap"),
        # one stage flags, the overall confidence is low: only LLM-Strict flags
        ("inference", _answer(d="neutral", confidence=0.3), "MB", "no_gap"),
        ("inference", _answer(a="off_target", c="entity_mismatch"), "CC", "no_gap"),
        ("inference", _answer(b="wrong_abstention"), "CC", "no_gap"),
        ("inference", _answer(c="entity_mismatch", d="neutral"), "IE", "no_gap"),
        ("inference", _answer(d="contradicted"), "CC", "no_gap"),
        # stage E is read for conclusions only, as in the tree
        ("inference", _answer(e="not_supported"), "no_gap", "no_gap"),
        ("conclusion", _answer(e="not_supported"), "IE", "no_gap"),
        # LLM-Only: confident gap, typed by the judge, even when no stage fails
        ("inference", _answer(gap_type="MB", confidence=0.5), "no_gap", "MB"),
        ("inference", _answer(a="off_target", gap_type="IE", confidence=0.8), "CC", "IE"),
        # confident, but names no type: the first failing stage types it
        ("conclusion", _answer(e="not_supported", confidence=0.9), "IE", "IE"),
        # a gap type below the threshold is no gap
        ("inference", _answer(gap_type="CC", confidence=0.4), "no_gap", "no_gap"),
    ],
)
def test_llm_strict_and_only_read_one_answer_differently(step_type, answer, strict, only):
    from stepgap.eval.llm_baselines import PromptOnlyAnswer, only_decision, strict_decision

    parsed = PromptOnlyAnswer.model_validate(answer)
    assert strict_decision(parsed, step_type)[0] == strict
    assert only_decision(parsed, step_type)[0] == only


def test_llm_only_refuses_to_guess_a_self_contradicting_answer():
    from stepgap.eval.llm_baselines import PromptOnlyAnswer, only_decision

    parsed = PromptOnlyAnswer.model_validate(_answer(confidence=0.7))
    label, path, error = only_decision(parsed, "inference")
    assert label is None and "inconsistent" in error and path[-1] == "gap_confidence:0.7:no_gap"


@pytest.fixture
def two_traces(traces, tmp_path):
    """case1 (inference, conclusion) and case2 (three inferences, conclusion) as a file."""
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(t.model_dump_json() + "\n" for t in traces[:2]), encoding="utf-8")
    return path, traces[:2]


def test_llm_baselines_through_an_openai_server(two_traces, tmp_path, monkeypatch):
    from stepgap.cli import main
    from stepgap.eval.baselines import run_baseline
    from stepgap.eval.llm_baselines import PromptOnlyAnswer, build_llm_requests
    from stepgap.io import read_models
    from stepgap.schema import Verdict
    from stepgap.teacher.judges import build_judge
    from stepgap.teacher.judges.base import answer_json_schema
    from stepgap.teacher.judges.openai_api import OpenAIJudge
    from tests.fixtures.openai_server import FakeOpenAI, prompt_key

    path, (case1, case2) = two_traces
    scripted = {
        (case1.id, 0): _answer(d="neutral", confidence=0.3),  # Strict MB, Only no_gap
        (case1.id, 1): _answer(e="not_supported", gap_type="IE", confidence=0.9),
        (case2.id, 0): _answer(a="off_target", gap_type="MB", confidence=0.6),  # CC vs MB
        (case2.id, 2): _answer(d="contradicted", gap_type="CC", confidence=1.0),
    }
    answers = {}
    for t in (case1, case2):
        for r in build_llm_requests(t):
            answers[prompt_key(r.messages)] = scripted.get((r.trace_id, r.step), _answer())
    closed = []  # a judge the baseline built is closed when it is done (a vLLM engine freed)
    monkeypatch.setattr(OpenAIJudge, "close", lambda self: closed.append(self), raising=False)
    server = FakeOpenAI(answers=answers).start()
    try:
        got = {}
        for kind in ("llm-strict", "llm-only"):
            out = tmp_path / f"{kind}.jsonl"
            assert main([
                "baseline", kind, str(path), "-o", str(out), "--judge", "openai:gpt-4.1-mini",
                "--base-url", server.base_url, "--cache", str(tmp_path / "cache.sqlite"),
                "--response-format", "json_schema",
            ]) == 0  # fmt: skip
            got[kind] = {(v.trace_id, v.step): v for _, v in read_models(out, Verdict)}
        assert len(closed) == 2
        given = build_judge("openai:gpt-4.1-mini", base_url=server.base_url,
                           cache=str(tmp_path / "cache.sqlite"), response_format="json_schema")  # fmt: skip
        run_baseline("llm-only", path, tmp_path / "given.jsonl", judge=given)
        assert len(closed) == 2  # one passed in is the caller's
        # one request per step, carrying the baseline's schema; the second variant came from the
        # judge cache, parsed back into the baseline's answer
        assert len(server.events) == 6
        for fmt in server.response_formats:
            assert fmt["json_schema"]["schema"] == answer_json_schema(PromptOnlyAnswer)
            assert "gap_confidence" in fmt["json_schema"]["schema"]["properties"]
    finally:
        server.stop()
    strict = {k: v.label for k, v in got["llm-strict"].items()}
    only = {k: v.label for k, v in got["llm-only"].items()}
    assert strict == {
        (case1.id, 0): "MB", (case1.id, 1): "IE",
        (case2.id, 0): "CC", (case2.id, 1): "no_gap", (case2.id, 2): "CC", (case2.id, 3): "no_gap",
    }  # fmt: skip
    assert only == {**strict, (case1.id, 0): "no_gap", (case2.id, 0): "MB"}
    v = got["llm-strict"][(case1.id, 0)]
    assert v.path[-1] == "stageD:neutral" and v.repair == "bridging-search"
    assert v.checker["baseline"] == "llm-strict" and v.llm_answer["gap_confidence"] == 0.3
    assert got["llm-only"][(case2.id, 0)].confidence == 0.6


def test_llm_baselines_refuse_a_replay_judge(two_traces, examples_dir, tmp_path):
    from stepgap.eval.baselines import run_baseline
    from stepgap.teacher.judges import JudgeConfigError

    path, _ = two_traces
    with pytest.raises(JudgeConfigError, match="cannot answer in the PromptOnlyAnswer schema"):
        run_baseline(
            "llm-only",
            path,
            tmp_path / "out.jsonl",
            judge=f"replay:{examples_dir / 'judge_replay.jsonl'}",
        )


@pytest.mark.slow
def test_llm_baselines_on_a_tiny_hf_model_are_held_to_their_schema(tiny_qwen2, traces, tmp_path):
    """Random weights, constrained decoding: every answer parses into the requested schema, and
    a teacher request in the same call still gets a judge object (a batch per schema)."""
    from stepgap.eval.llm_baselines import PromptOnlyAnswer, build_llm_requests, llm_baseline
    from stepgap.schema import Judge
    from stepgap.teacher.judges import build_judge
    from stepgap.teacher.prompt import build_requests

    judge = build_judge(
        f"hf:{tiny_qwen2}", max_string_chars=4, max_tokens=300, judge_batch_size=4,
        cache=str(tmp_path / "c.sqlite"),
    )  # fmt: skip
    step0 = traces[0].model_copy(update={"steps": traces[0].steps[:1]})  # one step: ~20 s each
    teacher = build_requests(step0.id, step0.question, step0.steps)[0]
    results = judge.judge([teacher, *build_llm_requests(step0)])
    assert isinstance(results[0].judge, Judge) and results[0].error is None
    assert isinstance(results[1].judge, PromptOnlyAnswer) and results[1].error is None
    (verdict,) = llm_baseline("llm-strict", [step0], judge)  # from the cache, as that schema
    assert judge.meter.cache_hits == 1 and judge.meter.calls == 2
    assert verdict.label is not None and verdict.llm_answer == results[1].judge.model_dump()


# ---------------------------------------------------------------- MiniCheck


def test_sentence_chunks_pack_whole_sentences_within_the_budget():
    from stepgap.eval.baselines import sentence_chunks, split_sentences

    snippets = [
        Snippet(title="Kuhn", text="Ernst Kuhn was an actor. He was born in Vienna in 1912."),
        Snippet(text="The army took the city. It was 1945! Was it? Yes."),
        Snippet(text=" ".join(["word"] * 12) + "."),
    ]
    lines = [f"{x.title}: {x.text}" if x.title else x.text for x in snippets]
    sentences = [s for line in lines for s in split_sentences(line)]
    assert sentences[:6] == [
        "Kuhn: Ernst Kuhn was an actor.", "He was born in Vienna in 1912.",
        "The army took the city.", "It was 1945!", "Was it?", "Yes.",
    ]  # fmt: skip
    chunks = sentence_chunks(snippets, max_words=8)
    assert " ".join(chunks) == " ".join(sentences)  # nothing lost, nothing cut
    for chunk in chunks:
        n = len(chunk.split())
        assert n <= 8 or chunk in sentences  # over budget only as one whole long sentence
    assert chunks == [
        "Kuhn: Ernst Kuhn was an actor.",
        "He was born in Vienna in 1912.",
        "The army took the city. It was 1945!",  # 8 words: fills the budget exactly
        "Was it? Yes.",
        " ".join(["word"] * 12) + ".",
    ]
    assert sentence_chunks([], 8) == [""]


class _TruncatingNLI(NLIBackend):
    """A scripted NLI model that sees only the first `max_words` words of a premise (a model's
    max length) and entails the claim exactly when it sees the sentence `KEY`."""

    name = "scripted"
    KEY = "Kuhn was born in Vienna."
    WRONG = "Kuhn was born in Paris."

    def __init__(self, max_words: int = 30) -> None:
        self.max_words = max_words
        self.pairs: list[tuple[str, str]] = []

    def predict(self, pairs):
        from stepgap.schema import NLIProbs

        self.pairs.extend(pairs)
        out = []
        for premise, _ in pairs:
            seen = " ".join(premise.split()[: self.max_words])
            if self.KEY in seen:
                out.append(NLIProbs(entailment=0.9, neutral=0.05, contradiction=0.05))
            elif self.WRONG in seen:
                out.append(NLIProbs(entailment=0.1, neutral=0.2, contradiction=0.7))
            else:
                out.append(NLIProbs(entailment=0.05, neutral=0.9, contradiction=0.05))
        return out


def _long_trace(last: str):
    from stepgap.schema import Trace

    filler = [Snippet(title=f"Doc {i}", text=f"Filler number {i} says nothing.") for i in range(8)]
    step = Step(
        index=0, type="inference", claim="Ernst Kuhn was born in Vienna.",
        evidence=[*filler, Snippet(title="Kuhn", text=f"An actor. {last}")],
    )  # fmt: skip
    return Trace(id="long", question="Where was Ernst Kuhn born?", steps=[step])


def test_minicheck_takes_the_best_chunk_where_one_truncated_premise_misses_it():
    from stepgap.eval.baselines import minicheck

    trace = _long_trace(_TruncatingNLI.KEY)
    (single,) = nli_only([trace], _TruncatingNLI())
    assert single.label == "MB"  # the supporting sentence lies past the model's max length
    nli = _TruncatingNLI()
    (v,) = minicheck([trace], nli, chunk_words=20)
    assert v.label == "no_gap" and v.confidence == 0.9
    assert len(v.nli) == len(nli.pairs) > 3  # every chunk scored and recorded
    assert [c.premise for c in v.nli] == [p for p, _ in nli.pairs]
    assert all(len(c.premise.split()) <= 20 for c in v.nli)
    n = len(v.nli)
    assert v.nli[-1].label == "entailment" and v.path == [f"minicheck:chunk {n}/{n}:entailment"]
    # unsupported: CC when the best chunk contradicts, MB when it is neutral
    (v,) = minicheck([_long_trace(_TruncatingNLI.WRONG)], _TruncatingNLI(), chunk_words=20)
    assert v.label == "CC" and v.repair == "retract"
    (v,) = minicheck([_long_trace("Nothing here.")], _TruncatingNLI(), chunk_words=20)
    assert v.label == "MB"


def test_minicheck_cli_on_the_examples(tiny_nli, examples_dir, tmp_path):
    from stepgap.cli import main
    from stepgap.io import read_models
    from stepgap.schema import Verdict

    out = tmp_path / "minicheck.jsonl"
    assert main([
        "baseline", "minicheck", str(examples_dir / "traces.jsonl"), "-o", str(out),
        "--nli", f"hf:{tiny_nli}", "--chunk-words", "12",
    ]) == 0  # fmt: skip
    verdicts = [v for _, v in read_models(out, Verdict)]
    assert len(verdicts) == 28 and verdicts[0].checker["baseline"] == "minicheck"
    assert max(len(v.nli) for v in verdicts) > 1  # long evidence was cut into chunks
    for v in verdicts:
        best = max(c.probs.entailment for c in v.nli)
        assert (v.label == "no_gap") == (best >= 0.5)
        assert v.label in ("no_gap", "CC", "MB")
    counts = nli_label_counts(verdicts)
    print("MiniCheck chunk labels on the examples:", counts)
