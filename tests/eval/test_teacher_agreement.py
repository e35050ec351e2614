"""`stepgap eval --teacher`: each checker's agreement with the teacher's labels and paths,
against figures worked out by hand on the example teacher verdicts and a copy with known edits."""

from __future__ import annotations

import json

import pytest

from stepgap.cli import main
from stepgap.eval.agreement import SINGLE_TOKEN_NOTE
from stepgap.eval.markdown import render_markdown
from stepgap.eval.report import PredStep, build_report, load_gold, load_predictions

NO_QUOTE = ["stageA:on_target", "stageB:not_abstention", "stageC:no_quote"]
QUOTE = ["stageA:on_target", "stageB:not_abstention", "stageC:quote"]


def _edited(teacher: list[dict]) -> list[dict]:
    """The teacher's 28 verdicts with known edits. Over the 26 steps both label (one failed
    check, one step missing) the teacher has 6 gaps (CC 3, IE 1, MB 2) and 20 no_gap."""
    by = {(v["trace_id"], v["step"]): dict(v) for v in teacher}
    edits = {
        # a missed gap (FN), and a firing stage of its own
        ("case2-kuhn-pertramer", 3): {"label": "no_gap", "path": [*QUOTE, "stageD:entailment"]},
        # a gap of another type (binary TP, typed miss), firing stage and first token differ
        ("hermes-blade-runner", 1): {"label": "MB", "path": [*QUOTE, "stageD:neutral"]},
        # a false gap (FP); the path is left alone
        ("cc-merkel-abstention", 0): {"label": "IE"},
        # the same label and firing stage, another first token: only the full path differs
        ("case1-whitehorse", 0): {"path": ["stageA:off_target:x", *NO_QUOTE[1:]]},
        # the same label, another firing stage (stage C instead of stage E)
        ("e-rashomon", 2): {"path": NO_QUOTE},
        # a failed check: counted, not scored
        ("ie-eiffel-stage-e", 1): {"label": None, "error": "judge API error: boom"},
    }
    for key, change in edits.items():
        by[key].update(change)
    del by[("nogap-tchaikovsky-abstention", 2)]  # missing
    extra = {**by[("case1-whitehorse", 1)], "trace_id": "not-in-the-teacher"}
    return [*by.values(), extra]


# Binary over the 26 steps: TP 5, FN 1, FP 1, TN 19.
EXPECTED = {
    "sP": 5 / 6,
    "sR": 5 / 6,
    "sF1": 5 / 6,
    "BA": (5 / 6 + 19 / 20) / 2,
    "kappa": (24 / 26 - 436 / 676) / (1 - 436 / 676),  # pe = (6*6 + 20*20) / 26^2
    "typed_accuracy": 23 / 26,
    "firing_stage_agreement": 23 / 26,  # case2 3, hermes 1, e-rashomon 2 end elsewhere
    "full_path_agreement": 22 / 26,  # and case1 0's first token
}
# One type against the rest: CC (tp 2, fn 1, tn 23), IE (tp 1, fp 1, tn 24), MB (1, 1, 1, 23).
KAPPA_PER_TYPE = {"CC": 92 / 118, "IE": 48 / 74, "MB": 44 / 96}


@pytest.fixture(scope="module")
def files(tmp_path_factory, examples_dir):
    d = tmp_path_factory.mktemp("teacher")
    teacher = examples_dir / "teacher_verdicts.jsonl"
    rows = [json.loads(x) for x in teacher.read_text().splitlines()]
    student = d / "student.jsonl"
    student.write_text("".join(json.dumps(v) + "\n" for v in _edited(rows)))
    return teacher, student


def _report(files, examples_dir, gold: bool = True, **kwargs):
    teacher, student = files
    labels = load_gold([examples_dir / "gold_steps.jsonl", examples_dir / "gold_traces.jsonl"])
    checkers = {"T": load_predictions(teacher), "S": load_predictions(student)}
    options = {"resamples": 300, "teacher": "T", **kwargs}
    return build_report(labels if gold else None, checkers, **options)


def test_agreement_is_with_the_teacher_to_hand_computed_values(files, examples_dir):
    report = _report(files, examples_dir)
    agreement = report["teacher_agreement"]
    assert agreement["teacher"] == "T" and set(agreement["checkers"]) == {"S"}  # no self-row
    s = agreement["checkers"]["S"]
    counts = ("n_scored", "missing_steps", "error_steps", "teacher_error_steps", "extra_steps")
    assert tuple(s[k] for k in counts) == (26, 1, 1, 0, 1)
    for name, value in EXPECTED.items():
        assert s[name] == pytest.approx(value, abs=1e-12), name
    assert s["kappa_per_type"] == pytest.approx(KAPPA_PER_TYPE, abs=1e-12)
    assert s["n_paths"] == 26 and s["path_note"] is None
    # the gold figures are there too, and are not the agreement's (gold differs from T twice)
    assert set(report["checkers"]) == {"T", "S"} and report["checkers"]["S"]["sF1"] != s["sF1"]


def test_agreement_has_bootstrap_cis_on_the_reports_unit(files, examples_dir):
    s = _report(files, examples_dir)["teacher_agreement"]["checkers"]["S"]
    assert set(s["ci"]) == {"sP", "sR", "sF1", "BA", "kappa", "typed_accuracy",
                            "firing_stage_agreement"}  # fmt: skip
    for name, (low, high) in s["ci"].items():
        assert low <= s[name] <= high and low < high, name
    by_trace = _report(files, examples_dir, unit="trace")["teacher_agreement"]["checkers"]["S"]
    assert by_trace["sF1"] == s["sF1"] and by_trace["ci"] != s["ci"]  # whole traces resampled


def test_agreement_needs_no_gold_and_then_the_report_has_no_gold_figures(files, examples_dir):
    with_gold = _report(files, examples_dir)
    alone = _report(files, examples_dir, gold=False)
    assert set(alone) == {"bootstrap", "teacher_agreement"}
    assert alone["teacher_agreement"] == with_gold["teacher_agreement"]
    md = render_markdown(alone)
    assert "## Agreement with the teacher (T)" in md and "## Checker variants" not in md
    assert "fidelity to the teacher, not quality" in md and "both be wrong" in md


def test_a_prm_path_compares_the_firing_stage_alone_and_says_so(files, examples_dir):
    teacher, _ = files
    preds = load_predictions(teacher)
    prm = [p.model_copy(update={"path": p.path[-1:]}) for p in preds]  # as PRMChecker writes
    prm[0] = prm[0].model_copy(update={"path": ["stageD:entailment"]})  # ends elsewhere
    report = build_report(None, {"T": preds, "prm": prm}, resamples=50, teacher="T")
    s = report["teacher_agreement"]["checkers"]["prm"]
    assert s["firing_stage_agreement"] == pytest.approx(27 / 28)
    assert s["full_path_agreement"] is None and s["path_note"] == SINGLE_TOKEN_NOTE
    assert f"- prm: {SINGLE_TOKEN_NOTE}." in render_markdown(report)


def test_a_checker_with_no_step_in_common_has_counts_and_no_figures(files, examples_dir):
    teacher, _ = files
    preds = load_predictions(teacher)
    down = [PredStep(trace_id=p.trace_id, step=p.step, error="timeout") for p in preds]
    report = build_report(None, {"T": preds, "down": down}, resamples=20, teacher="T")
    s = report["teacher_agreement"]["checkers"]["down"]
    assert (s["n_scored"], s["error_steps"], s["sF1"], s["ci"]) == (0, 28, None, {})
    assert "| down | nothing to compare |" in render_markdown(report)


def test_eval_teacher_from_the_command_line(files, tmp_path, capsys):
    teacher, student = files
    out = tmp_path / "report"
    rc = main(["eval", "--pred", f"T={teacher}", "--pred", f"S={student}", "--silver", "T",
               "--resamples", "50", "-o", str(out)])  # fmt: skip
    assert rc == 0 and sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]
    report = json.loads((out / "report.json").read_text())
    assert report["teacher_agreement"]["checkers"]["S"]["typed_accuracy"] == pytest.approx(23 / 26)
    md = (out / "report.md").read_text()
    assert "| S | 83.3 [" in md and "| T |" not in md
    assert main(["eval", "--pred", f"T={teacher}", "--teacher", "X", "-o", str(out)]) == 2
    assert "--teacher 'X' is not one of the --pred names" in capsys.readouterr().err
    assert main(["eval", "--pred", f"T={teacher}", "-o", str(out)]) == 2
    assert "give --gold FILE, --teacher NAME" in capsys.readouterr().err
