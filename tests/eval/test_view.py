"""`stepgap view` without a browser: the page's data (quote spans as stage C finds them, EM,
gold, rewards, the report's figures), its escaping, bad input and the command.
The rendered page itself is checked in Chromium by `test_view_browser.py`."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepgap.cli import main
from stepgap.eval.report import build_report, load_gold, load_predictions
from stepgap.eval.view import parse_named_files, render_view, write_view
from stepgap.eval.view_data import locate_quote, view_data
from stepgap.eval.view_page import embed_json
from stepgap.io import ErrorReport, read_models
from stepgap.schema import Snippet, Verdict
from stepgap.segment import iter_traces
from stepgap.tree import normalise_quote_with_origin, quote_in_evidence

DATA = re.compile(r'<script type="application/json" id="stepgap-data">(.*?)</script>', re.S)


def page_data(page: str) -> dict:
    (blob,) = DATA.findall(page)
    return json.loads(blob)


def verdicts_of(path) -> list[Verdict]:
    return [v for _, v in read_models(path, Verdict)]


# ------------------------------------------------------------------ the quote, as stage C sees it
TEXT = st.text(alphabet=st.sampled_from(list("abAB ß\u0130\n\t\u00a0xyZ.,😀")), max_size=40)


@given(text=TEXT, data=st.data())
def test_the_highlight_agrees_with_stage_c(text, data):
    """Wherever stage C says a quote is verbatim, the page finds where; nowhere else."""
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, len(text)))
    mutate = data.draw(st.sampled_from(["same", "upper", "spaces", "other"]))
    quote = text[start:end]
    if mutate == "upper":
        quote = quote.upper()
    elif mutate == "spaces":
        quote = "  " + "\n ".join(quote.split(" ")) + " "
    elif mutate == "other":
        quote = data.draw(TEXT)
    normalised, origin = normalise_quote_with_origin(text)
    assert normalised == " ".join(text.split()).casefold()
    assert len(origin) == len(normalised)
    span = locate_quote(quote, text)
    assert (span is not None) == quote_in_evidence(quote, [Snippet(text=text)])
    if span is not None:
        needle = " ".join(quote.split()).casefold()
        assert needle in " ".join(text[span[0] : span[1]].split()).casefold()


def test_quote_spans_are_javascript_string_indices(view_inputs):
    """Characters beyond the BMP count twice in a JS string: the span must too."""
    (trace, *_) = iter_traces(view_inputs.traces)
    (v0, v1) = verdicts_of(view_inputs.verdicts)[:2]
    quote = v1.judge.step_1_quote_search.evidence_quote
    prefix = "😀 emoji 𝔘 first. "
    snippet = trace.steps[0].evidence[0]
    trace.steps[0].evidence[0] = snippet.model_copy(update={"text": prefix + snippet.text})
    data = view_data([trace], {"c": [v0, v1]})
    (hit,) = data["traces"][0]["steps"][1]["verdicts"][0]["quote"]["hits"]
    text = trace.steps[0].evidence[0].text
    js = text.encode("utf-16-le")
    assert js[2 * hit["start"] : 2 * hit["end"]].decode("utf-16-le") == quote
    assert (hit["step"], hit["doc"], hit["field"]) == (0, 0, "text")


def test_a_quote_that_is_not_verbatim_is_marked_and_never_highlighted(view_inputs):
    (trace, *_) = iter_traces(view_inputs.traces)
    v0, v1 = verdicts_of(view_inputs.verdicts)[:2]
    judge = v1.judge.model_copy(deep=True)
    judge.step_1_quote_search.evidence_quote = "The terminal handled 300,000 passengers in 2012"
    data = view_data([trace], {"c": [v0, v1.model_copy(update={"judge": judge})]})
    quote = data["traces"][0]["steps"][1]["verdicts"][0]["quote"]
    assert quote == {
        "text": "The terminal handled 300,000 passengers in 2012",
        "found": True,
        "verbatim": False,
        "hits": [],
    }


def test_verbatim_flags_match_the_stored_stage_c_tokens(view_inputs):
    traces = list(iter_traces(view_inputs.traces))
    verdicts = verdicts_of(view_inputs.verdicts)
    data = view_data(traces, {"StepGap": verdicts})
    seen = Counter()
    for t in data["traces"]:
        for s in t["steps"]:
            (v,) = s["verdicts"]
            tokens = [p for p in v["path"] if p.startswith("stageC:")]
            if tokens == ["stageC:quote"]:
                assert v["quote"]["verbatim"] and v["quote"]["hits"]
                seen["quote"] += 1
            elif tokens == ["stageC:no_quote"]:
                assert not v["quote"]["found"]
                seen["no_quote"] += 1
    assert seen == {"quote": 11, "no_quote": 13}


# ------------------------------------------------------------------ answers, gold, rewards
def test_answers_gold_rewards_and_figures_come_from_the_package(view_inputs, tmp_path):
    gold = load_gold(view_inputs.gold)
    rewards = {json.loads(line)["trace_id"]: json.loads(line) for line in open(view_inputs.rewards)}
    page = write_view(
        view_inputs.traces,
        {"StepGap": view_inputs.verdicts},
        tmp_path / "view.html",
        rewards=view_inputs.rewards,
        gold=view_inputs.gold,
        resamples=200,
    )
    data = page_data(page.path.read_text(encoding="utf-8"))
    assert (page.traces, page.steps) == (10, 28)
    by_id = {t["id"]: t for t in data["traces"]}
    for tid, t in by_id.items():
        assert t["em"] == rewards[tid]["em"]  # EM as the reward computes it
        assert t["reward"]["total"] == rewards[tid]["reward"]
        assert [s["reward"]["bracket"] for s in t["steps"]] == [
            s["bracket"] for s in rewards[tid]["steps"]
        ]
        assert t["gold_correct"] == gold.correct[tid]
    assert by_id["case1-whitehorse"]["answer"].strip() == "294,000"
    # Disagreement with gold, step by step.
    verdicts = {(v.trace_id, v.step): v.label for v in verdicts_of(view_inputs.verdicts)}
    expected = sum(verdicts[k] != lab for k, lab in gold.steps.items())
    assert data["summary"]["disagreeing_steps"] == expected
    assert sum(s["disagree"] for t in data["traces"] for s in t["steps"]) == expected
    # The report's figures are build_report's, for the same inputs.
    report = build_report(gold, {"StepGap": load_predictions(view_inputs.verdicts)}, resamples=200)
    shown = data["summary"]["report"]["checkers"]["StepGap"]
    for key in ("sF1", "BA", "QF1", "kappa", "ci"):
        assert shown[key] == report["checkers"]["StepGap"][key]
    assert data["summary"]["distribution"]["StepGap"] == dict(Counter(verdicts.values()))


def test_the_page_says_where_its_verdicts_come_from(view_inputs, tmp_path):
    """Replayed answers and stand-in models are named on the page, per checker, from what each
    verdict recorded (its `checker`); verdicts that record nothing add nothing."""
    recorded = verdicts_of(view_inputs.verdicts)
    assert all(v.checker for v in recorded)
    bare = tmp_path / "bare.jsonl"
    bare.write_text("".join(v.model_copy(update={"checker": None}).model_dump_json() + "\n"
                            for v in recorded))  # fmt: skip
    page = write_view(
        view_inputs.traces, {"StepGap": view_inputs.verdicts, "bare": bare}, tmp_path / "v.html"
    )
    sources = page_data(page.path.read_text(encoding="utf-8"))["summary"]["sources"]
    notes = {f"{part} {v.checker[part]['spec']}: {v.checker[part]['note']}"
             for v in recorded for part in ("judge", "nli") if v.checker[part].get("note")}  # fmt: skip
    assert notes and set(sources["StepGap"]) == notes
    assert any("replayed" in note for note in notes)
    assert "bare" not in sources


def test_two_checkers_disagree_where_their_labels_differ(view_inputs):
    traces = list(iter_traces(view_inputs.traces))
    a, b = verdicts_of(view_inputs.verdicts), verdicts_of(view_inputs.minus_e)
    data = view_data(traces, {"StepGap": a, "minus-E": b})
    differ = {(x.trace_id, x.step) for x, y in zip(a, b, strict=True) if x.label != y.label}
    marked = {(t["id"], s["index"]) for t in data["traces"] for s in t["steps"] if s["disagree"]}
    assert marked == differ and len(differ) == 2
    assert [len(s["verdicts"]) for t in data["traces"] for s in t["steps"]] == [2] * 28


def test_a_step_without_a_verdict_is_shown_missing_not_no_gap(view_inputs):
    traces = list(iter_traces(view_inputs.traces))
    verdicts = [v for v in verdicts_of(view_inputs.verdicts) if v.trace_id != "case4-whiplash"]
    data = view_data(traces, {"c": verdicts})
    assert data["summary"]["distribution"]["c"]["missing"] == 3
    case4 = next(t for t in data["traces"] if t["id"] == "case4-whiplash")
    assert case4["labels"] == ["missing"]


# ------------------------------------------------------------------ escaping
PAYLOAD = "</script><script>window.__pwned = 1</script><!-- <img src=x onerror=alert(1)> & \u2028"


def test_embedded_json_cannot_close_its_script_block():
    text = embed_json({"evidence": PAYLOAD, PAYLOAD: [PAYLOAD]})
    assert not set("<>&") & set(text)
    assert json.loads(text) == {"evidence": PAYLOAD, PAYLOAD: [PAYLOAD]}


def test_untrusted_text_never_reaches_the_page_as_markup(view_inputs):
    (trace, *_) = iter_traces(view_inputs.traces)
    v0, v1 = verdicts_of(view_inputs.verdicts)[:2]
    trace = trace.model_copy(update={"question": PAYLOAD, "id": PAYLOAD})
    trace.steps[0].evidence[0] = Snippet(title=PAYLOAD, text=PAYLOAD)
    v0 = v0.model_copy(update={"trace_id": PAYLOAD, "rationale": PAYLOAD})
    v1 = v1.model_copy(update={"trace_id": PAYLOAD})
    page = render_view([trace], {PAYLOAD: [v0, v1]}, title=PAYLOAD)
    assert page.count("<script") == 2 and page.count("</script>") == 2  # data + the drawing code
    assert "<img" not in page and "<!--" not in page
    assert "<title>&lt;/script&gt;&lt;script&gt;" in page
    assert page_data(page)["traces"][0]["question"] == PAYLOAD


# ------------------------------------------------------------------ files and the command
def test_bad_lines_are_reported_and_the_rest_is_shown(view_inputs, tmp_path):
    lines = view_inputs.verdicts.read_text().splitlines()
    bad = tmp_path / "verdicts.jsonl"
    bad.write_text("\n".join([lines[0], "{not json", lines[1], lines[1], *lines[2:]]) + "\n")
    rewards = tmp_path / "rewards.jsonl"
    first, *rest = view_inputs.rewards.read_text().splitlines()
    broken = json.loads(first)
    broken["steps"][0]["bracket"] = "a lot"
    rewards.write_text("\n".join([json.dumps(broken), *rest]) + "\n")
    report = ErrorReport()
    result = write_view(
        view_inputs.traces, {"c": bad}, tmp_path / "v.html", rewards=rewards, report=report
    )
    assert result.unmatched == {"c": 0}
    assert [str(e) for e in report.errors] == [
        f"{bad}:2: invalid JSON: Expecting property name enclosed in double quotes (column 2)",
        f"{bad}:4: step: trace 'case1-whitehorse' step 1 has a verdict already (line 3); "
        "this line is skipped",
        f"{rewards}:1: steps.0.bracket: Input should be a valid number, unable to parse string "
        "as a number",
    ]
    data = page_data(result.path.read_text(encoding="utf-8"))
    assert data["summary"]["distribution"]["c"].get("missing", 0) == 0
    assert data["traces"][0]["reward"] is None and data["traces"][1]["reward"] is not None


def test_named_files():
    assert parse_named_files(["a/b/StepGap.jsonl", "minus-E=x.jsonl"]) == {
        "StepGap": "a/b/StepGap.jsonl",
        "minus-E": "x.jsonl",
    }
    with pytest.raises(ValueError, match="given twice"):
        parse_named_files(["a/v.jsonl", "b/v.jsonl"])
    with pytest.raises(ValueError, match="NAME=FILE"):
        parse_named_files(["=x.jsonl"])


def test_the_view_command_writes_the_page_and_prints_its_path(view_inputs, tmp_path, capsys):
    out = tmp_path / "view.html"
    argv = [
        "view", str(view_inputs.traces), f"--verdicts={view_inputs.verdicts}",
        f"--verdicts=minus-E={view_inputs.minus_e}", f"--reward={view_inputs.rewards}",
        *(f"--gold={g}" for g in view_inputs.gold), "--resamples=100", "-o", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{out}\n"
    assert "wrote 10 trace(s), 28 step(s)" in captured.err
    data = page_data(out.read_text(encoding="utf-8"))
    assert data["checkers"] == ["StepGap", "minus-E"] and data["has_gold"] and data["has_reward"]
    assert main([*argv[:2], f"--verdicts={view_inputs.verdicts}", *argv[2:]]) == 2
    assert "name 'StepGap' given twice" in capsys.readouterr().err
    few = tmp_path / "three_traces.jsonl"
    few.write_text("".join(view_inputs.traces.read_text().splitlines(keepends=True)[:3]))
    assert main(["view", str(few), *argv[2:4], "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "StepGap: 20 verdict(s) for no step of" in err and "minus-E: 20 verdict(s)" in err


def test_a_trace_with_a_failed_check_is_shown_with_no_reward_and_why(view_inputs, tmp_path):
    """`stepgap view` reads a failed step check as `stepgap reward` and training do: no reward
    and why, never an R = ... formula with a number, even from a file written with failed
    checks scored 0; `--on-failed-check zero` shows the number, noted as that reading."""
    from stepgap.serving.reward_function import reward_file

    lines = [json.loads(x) for x in view_inputs.verdicts.read_text().splitlines()]
    for v in lines:
        if v["trace_id"] == "case4-whiplash" and v["step"] in (0, 2):
            v.update(label=None, repair=None, error="judge down")
    verdicts = tmp_path / "failed.jsonl"
    verdicts.write_text("".join(json.dumps(v) + "\n" for v in lines))
    rewards = {}
    for reading in ("no_reward", "zero"):
        rewards[reading] = tmp_path / f"rewards_{reading}.jsonl"
        reward_file(view_inputs.traces, verdicts, rewards[reading], on_failed_check=reading)
    shown = {}
    for reading, file in [("no_reward", "no_reward"), ("no_reward", "zero"), ("zero", "zero"),
                          ("zero", "no_reward")]:  # fmt: skip
        out = tmp_path / f"{reading}-{file}.html"
        argv = ["view", str(view_inputs.traces), f"--verdicts={verdicts}",
                f"--reward={rewards[file]}", f"--on-failed-check={reading}", "-o", str(out)]  # fmt: skip
        assert main(argv) == 0
        traces = page_data(out.read_text(encoding="utf-8"))["traces"]
        shown[reading, file] = {t["id"]: t["reward"] for t in traces}
    why = "2 of 3 step check(s) failed"
    for file in ("no_reward", "zero"):  # the file's own reason, or the count it records
        r = shown["no_reward", file]["case4-whiplash"]
        assert r["total"] is None and r["unavailable"].startswith(why) and r["note"] is None
    assert shown["no_reward", "no_reward"]["case4-whiplash"]["unavailable"].endswith("judge down)")
    number = json.loads(
        next(x for x in rewards["zero"].read_text().splitlines() if "case4-whiplash" in x)
    )["reward"]
    for file in ("no_reward", "zero"):  # the same number, from the file or from its brackets
        r = shown["zero", file]["case4-whiplash"]
        assert r["total"] == number and r["unavailable"] is None
        assert r["note"] == "2 failed step check(s) scored 0 (--on-failed-check zero)"
    for key, by_id in shown.items():  # the other traces are shown alike every way
        assert by_id["case1-whitehorse"] == shown["no_reward", "no_reward"]["case1-whitehorse"]
        assert by_id["case1-whitehorse"]["total"] is not None, key
