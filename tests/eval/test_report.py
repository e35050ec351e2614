"""`stepgap eval` end to end on the example verdicts, joins, missing steps, sweep, PNG plots."""

from __future__ import annotations

import json
import sys

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


def test_eval_without_matplotlib_writes_the_report_and_says_so_in_one_line(
    example_verdicts, examples_dir, tmp_path, monkeypatch, capsys
):
    """The `plots` extra is optional: without it `stepgap eval` is no traceback."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "report"
    rc = main(["eval", "--gold", str(examples_dir / "gold_steps.jsonl"), "--pred",
               f"StepGap={example_verdicts / 'stepgap.jsonl'}", "--resamples", "50", "-o", str(out)])  # fmt: skip
    assert rc == 0
    assert (out / "report.json").is_file() and not list(out.glob("*.png"))
    err = [line for line in capsys.readouterr().err.splitlines() if "no PNG" in line]
    assert err == [
        "stepgap eval: no PNG plots: matplotlib is not installed (pip install 'stepgap[plots]'); "
        "the report is written without them"
    ]


def test_eval_writes_report_markdown_and_png_plots(example_verdicts, examples_dir, tmp_path):
    d, out = example_verdicts, tmp_path / "report"
    rc = main([
        "eval", "--gold", str(examples_dir / "gold_steps.jsonl"),
        "--gold", str(examples_dir / "gold_traces.jsonl"),
        "--pred", f"StepGap={d / 'stepgap.jsonl'}", "--pred", f"minus-E={d / 'minusE.jsonl'}",
        "--pred", f"flag-all={d / 'flag.jsonl'}", "--teacher", "StepGap", "--resamples", "300",
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
    agreement = report["teacher_agreement"]
    assert set(agreement["checkers"]) == {"minus-E", "flag-all"}  # the teacher has no row
    assert agreement["teacher"] == "StepGap" and agreement["checkers"]["minus-E"]["n_scored"] == 28
    md = (out / "report.md").read_text()
    assert "| flag-all |" in md and "DEGENERATE" in md and "wrong answer" in md
    assert "## Agreement with the teacher (StepGap)" in md and "the gold figures above" in md
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


def test_a_checker_with_no_scored_step_is_reported_and_the_others_written(
    example_verdicts, examples_dir, tmp_path, capsys
):
    failed = tmp_path / "all_failed.jsonl"
    rows = [json.loads(x) for x in (example_verdicts / "stepgap.jsonl").read_text().splitlines()]
    for r in rows:
        r.update(label=None, repair=None, error="judge API error: 500")
    failed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "report"
    rc = main([
        "eval", "--gold", str(examples_dir / "gold_steps.jsonl"),
        "--gold", str(examples_dir / "gold_traces.jsonl"), "--resamples", "50",
        "--pred", f"down={failed}", "--pred", f"StepGap={example_verdicts / 'stepgap.jsonl'}",
        "-o", str(out),
    ])  # fmt: skip
    assert rc == 0
    assert "down: no gold step has a predicted label" in capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    down, ok = report["checkers"]["down"], report["checkers"]["StepGap"]
    assert (down["scored"], down["sF1"], down["error_steps"]) == (False, None, 28)
    assert ok["scored"] and ok["n_scored"] == 28 and ok["sF1"] is not None
    assert "| down | no scored step |" in (out / "report.md").read_text()


@pytest.fixture(scope="module")
def example_report(example_verdicts, examples_dir):
    gold = load_gold([examples_dir / "gold_steps.jsonl", examples_dir / "gold_traces.jsonl"])
    preds = {
        name: [
            PredStep.model_validate_json(x) for x in (example_verdicts / f).read_text().splitlines()
        ]
        for name, f in (("StepGap", "stepgap.jsonl"), ("flag", "flag.jsonl"))
    }
    return build_report(gold, preds, resamples=100)


def test_report_md_defines_its_figures_and_says_which_health_rule_fired(example_report):
    from stepgap.eval.markdown import render_markdown

    md = render_markdown(example_report)
    for phrase in ("**Binary**", "(TPR + TNR) / 2", "typed acc", "2w/(1+w)", "Cohen's kappa"):
        assert phrase in md
    flag = example_report["checkers"]["flag"]
    # flag-everything writes IE everywhere: IE 100%, CC and MB never
    assert flag["health_issues"] == [
        "IE is 100% of steps (above 70%)",
        "CC is never predicted",
        "MB is never predicted",
    ]
    assert "DEGENERATE: IE is 100% of steps (above 70%); CC is never predicted" in md
    # typed agreement beside the binary figures: flag-everything hits every gap (sR = 1) but
    # gets the type right only on the gold IE steps
    assert flag["sR"] == 1.0 and flag["typed_accuracy"] < flag["sR"]


def test_plots_share_one_scale_distinct_colours_and_legends_beside_the_axes(example_report):
    from stepgap.eval import plots

    fig = plots.figure_distribution(example_report)
    ax = fig.axes[0]
    assert ax.get_ylim() == (0.0, 1.0)
    colours = {p.get_facecolor() for p in ax.patches}
    assert len(colours) == 4  # one per label
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # beside the bars, not on them
    fig = plots.figure_threshold_sweep(example_report)
    f1_ax, ie_ax = fig.axes
    assert f1_ax.get_ylim() == (0.0, 1.0) and ie_ax.get_ylim() == (0.0, 1.0)
    lines = [line for line in ie_ax.get_lines() if line.get_label() in ("StepGap", "flag")]
    assert len({line.get_color() for line in lines}) == 2
    fig = plots.figure_forest(example_report)
    assert all(ax.get_xlim()[1] == 1.0 for ax in fig.axes)


def test_a_label_has_the_same_colour_in_the_plots_and_in_the_view(example_report):
    """The bars of `label_distribution.png` take each label's colour from the page `stepgap
    view` draws (MB was blue in one and purple in the other)."""
    import re

    from matplotlib.colors import to_hex

    from stepgap.eval import plots
    from stepgap.eval.view_page import render_html

    page = render_html({"title": "t"})
    in_view = dict(re.findall(r"--(no_gap|CC|IE|MB)-fg: (#[0-9a-f]{6})", page))
    ax = plots.figure_distribution(example_report).axes[0]
    in_plot = {
        container.get_label(): to_hex(container.patches[0].get_facecolor())
        for container in ax.containers
    }
    assert set(in_view) == {"no_gap", "CC", "IE", "MB"}
    assert in_plot == in_view
