"""`stepgap eval` end to end on the example verdicts, joins, missing steps, sweep, PNG plots."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from stepgap.cli import main
from stepgap.eval.report import PredStep, build_report, load_gold, threshold_sweep

SPEC_KEYS = {
    "sP", "sR", "sF1", "BA", "QF1", "kappa", "kappa_per_type", "ci", "distribution", "healthy",
    "first_gap", "answer_gap", "missing_steps",
}  # fmt: skip


@pytest.fixture(scope="module")
def example_verdicts(tmp_path_factory, examples_dir):
    d = tmp_path_factory.mktemp("verdicts")
    ex = examples_dir
    assert main(["check", str(ex / "traces.jsonl"), "--judge", f"replay:{ex / 'judge_replay.jsonl'}",
                 "--nli", f"replay:{ex / 'nli_replay.jsonl'}", "-o", str(d / "stepgap.jsonl")]) == 0  # fmt: skip
    assert (
        main(["relabel", str(d / "stepgap.jsonl"), "--ablate", "E", "-o", str(d / "minusE.jsonl")])
        == 0
    )
    assert (
        main(["baseline", "flag-everything", str(ex / "traces.jsonl"), "-o", str(d / "flag.jsonl")])
        == 0
    )
    return d


def test_eval_writes_report_markdown_and_png_plots(example_verdicts, examples_dir, tmp_path):
    d, out = example_verdicts, tmp_path / "report"
    rc = main([
        "eval", "--gold", str(examples_dir / "gold_steps.jsonl"),
        "--gold", str(examples_dir / "gold_traces.jsonl"),
        "--pred", f"StepGap={d / 'stepgap.jsonl'}", "--pred", f"minus-E={d / 'minusE.jsonl'}",
        "--pred", f"flag-all={d / 'flag.jsonl'}", "--silver", "StepGap", "--resamples", "300",
        "-o", str(out),
    ])  # fmt: skip
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert (report["n_steps"], report["n_traces"]) == (28, 10)
    assert set(report["checkers"]) == {"StepGap", "minus-E", "flag-all"}
    for c in report["checkers"].values():
        assert SPEC_KEYS <= set(c)
        assert set(c["kappa_per_type"]) == {"CC", "IE", "MB"}
        assert set(c["distribution"]) == {"no_gap", "CC", "IE", "MB"}
        for metric in ("sP", "sR", "sF1", "BA", "QF1"):
            low, high = c["ci"][metric]
            assert 0 <= low <= c[metric] + 1e-9 and c[metric] - 1e-9 <= high <= 1
    flag = report["checkers"]["flag-all"]
    # Flag-everything: recall 1, BA at chance, Q-F1 exactly the closed form for this set's w.
    assert flag["sR"] == 1.0 and flag["BA"] == 0.5 and not flag["healthy"]
    assert flag["QF1"] == pytest.approx(flag["QF1_flag_everything"])
    assert sum(flag["answer_gap"].values()) == 10
    assert report["checkers"]["minus-E"]["silver"]["n"] == 28
    md = (out / "report.md").read_text()
    assert "| flag-all |" in md and "DEGENERATE" in md and "wrong answer" in md
    for name in ("label_distribution.png", "ci_forest.png", "threshold_sweep.png"):
        with Image.open(out / name) as img:
            assert img.format == "PNG" and img.size[0] > 300 and img.size[1] > 200
            img.load()  # decodes the whole image


def test_missing_and_failed_steps_are_counted_not_dropped(example_verdicts, examples_dir, tmp_path):
    lines = (example_verdicts / "stepgap.jsonl").read_text().splitlines()
    broken = [json.loads(x) for x in lines[3:]]  # three steps missing
    broken[0].update(label=None, repair=None, error="judge API error: boom")  # one failed
    pred = tmp_path / "pred.jsonl"
    pred.write_text("".join(json.dumps(v) + "\n" for v in broken))
    gold = load_gold([examples_dir / "gold_steps.jsonl", examples_dir / "gold_traces.jsonl"])
    preds = [PredStep.model_validate(v) for v in broken]
    c = build_report(gold, {"x": preds}, resamples=50)["checkers"]["x"]
    assert (c["missing_steps"], c["error_steps"], c["n_scored"]) == (3, 1, 24)


def test_bad_pred_spec_and_missing_gold_are_clear_errors(tmp_path, examples_dir, capsys):
    assert main(["eval", "--gold", str(examples_dir / "gold_steps.jsonl"), "--pred", "nofile",
                 "-o", str(tmp_path)]) == 2  # fmt: skip
    assert "NAME=FILE" in capsys.readouterr().err
    assert (
        main(["eval", "--gold", str(tmp_path / "nope.jsonl"), "--pred", "a=b", "-o", str(tmp_path)])
        == 2
    )


def test_threshold_sweep_drops_low_confidence_flags():
    gold = np.array(["CC", "IE", "no_gap", "MB"], dtype=object)
    preds = [
        PredStep(trace_id="t", step=0, label="CC", confidence=0.95),
        PredStep(trace_id="t", step=1, label="IE", confidence=0.4),
        PredStep(trace_id="t", step=2, label="MB", confidence=0.6),
        PredStep(trace_id="t", step=3, label="MB", confidence=None),  # no confidence: kept
    ]
    rows = {r["threshold"]: r for r in threshold_sweep(gold, preds, [0.3, 0.5, 0.9])}
    assert [rows[t]["flagged_share"] for t in (0.3, 0.5, 0.9)] == [1.0, 0.75, 0.5]
    assert rows[0.5]["IE_share"] == 0.0 and rows[0.3]["IE_share"] == 0.25
    assert rows[0.9]["sF1"] == pytest.approx(2 * 2 / (2 * 2 + 0 + 1))


def test_trace_unit_bootstrap_is_reproducible(examples_dir, example_verdicts):
    gold = load_gold([examples_dir / "gold_steps.jsonl", examples_dir / "gold_traces.jsonl"])
    preds = [
        PredStep.model_validate_json(x)
        for x in (example_verdicts / "flag.jsonl").read_text().splitlines()
    ]
    a = build_report(gold, {"f": preds}, resamples=200, seed=3, unit="trace")
    b = build_report(gold, {"f": preds}, resamples=200, seed=3, unit="trace")
    c = build_report(gold, {"f": preds}, resamples=200, seed=4, unit="trace")
    assert a == b and a["checkers"]["f"]["ci"]["sP"] != c["checkers"]["f"]["ci"]["sP"]
