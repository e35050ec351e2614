"""The `stepgap` console script: help, segment and check end to end on the shipped examples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stepgap.cli import COMMANDS, main
from tests.fixtures import models

# The console script installed next to the interpreter running the tests (CI does not activate
# the virtual environment, so `stepgap` need not be on PATH).
STEPGAP = str(Path(sys.executable).parent / "stepgap")


def test_help_lists_every_command():
    out = subprocess.run([STEPGAP, "--help"], capture_output=True, text=True, check=True).stdout
    for name in COMMANDS:
        assert name in out
    for name in COMMANDS:
        assert subprocess.run([STEPGAP, name, "--help"], capture_output=True).returncode == 0


def test_segment_reports_bad_lines_and_keeps_the_rest(tmp_path, examples_dir, capsys):
    src = tmp_path / "in.jsonl"
    lines = (examples_dir / "traces.jsonl").read_text().splitlines()
    src.write_text("\n".join([lines[0], "{oops", lines[1]]) + "\n")
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    assert main(["segment", str(src), "-o", str(out), "--errors", str(errors)]) == 3  # skipped
    traces = [json.loads(line) for line in out.read_text().splitlines()]
    assert [t["id"] for t in traces] == ["case1-whitehorse", "case2-kuhn-pertramer"]
    assert traces[1]["steps"][3]["answer"] == "no"
    assert traces[0]["data_source"] == "2wikimultihopqa"  # extra keys are kept
    (err,) = [json.loads(line) for line in errors.read_text().splitlines()]
    assert err["line"] == 2 and "invalid JSON" in err["reason"]
    assert f"{src}:2" in capsys.readouterr().err


def test_missing_input_is_a_clear_error(tmp_path, capsys):
    assert main(["segment", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "o.jsonl")]) == 2
    assert "input file not found" in capsys.readouterr().err


def test_a_mistyped_input_fails_before_any_model_loads(tmp_path, capsys, monkeypatch):
    """`check`, `label` and `baseline` load their models before they read traces: with a real
    7B judge that takes minutes, so a path that does not exist is said first."""
    import stepgap.cli.teacher as teacher_cli
    import stepgap.eval.baselines as baselines

    def loads(*args, **kwargs):
        raise AssertionError("a model was loaded for an input that does not exist")

    monkeypatch.setattr(teacher_cli, "checker", loads)
    monkeypatch.setattr(baselines, "run_baseline", loads)
    missing, out = str(tmp_path / "trace.jsonl"), str(tmp_path / "out.jsonl")
    for argv in (
        ["check", missing, "--bundle", str(tmp_path), "-o", out],
        ["label", missing, "--judge", "hf:x", "--nli", "hf:y", "-o", out],
        ["baseline", "nli-only", missing, "--nli", "hf:y", "-o", out],
    ):
        assert main(argv) == 2, argv
        assert f"input file not found: {missing}" in capsys.readouterr().err
    assert not Path(out).exists()


def test_check_with_a_real_tiny_nli_model(tmp_path, examples_dir, tiny_nli):
    out = tmp_path / "verdicts.jsonl"
    rc = main(
        [
            "check",
            str(examples_dir / "traces.jsonl"),
            "--judge",
            f"replay:{examples_dir / 'judge_replay.jsonl'}",
            "--nli",
            str(tiny_nli),
            "--device",
            "cpu",
            "-o",
            str(out),
        ]
    )
    assert rc == 0
    verdicts = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(verdicts) == 28
    # Judge-decided steps keep their labels; NLI-decided ones carry the model's probabilities.
    by_key = {(v["trace_id"], v["step"]): v for v in verdicts}
    assert by_key[("hermes-blade-runner", 1)]["label"] == "CC"
    d = by_key[("case2-kuhn-pertramer", 3)]
    assert d["path"][-1].startswith("stageD:") and len(d["nli"]) == 1
    probs = d["nli"][0]["probs"]
    assert abs(sum(probs.values()) - 1) < 1e-5
    counts = models.nli_label_counts(verdicts)  # the stand-in's labels vary with the pair
    assert sum(n > 0 for n in counts.values()) >= 2, counts
    print("NLI labels on the examples:", counts)


def test_module_entry_point():
    out = subprocess.run(
        [sys.executable, "-m", "stepgap.cli", "--version"], capture_output=True, text=True
    )
    assert out.stdout.startswith("stepgap ")


def test_no_progress_quiets_the_bars_of_the_libraries_too(
    tmp_path, examples_dir, capfd, monkeypatch
):
    """`--no-progress` covers transformers' weight-loading bar (a bundle's student printed one
    with the flag before), and the Hub's bars: the flag sets the Hub's setting, which a vLLM
    judge passes to its engine (tests/teacher/judges/test_engines.py). Without a terminal (a
    log file, a pipe) the libraries' bars are quiet without the flag."""
    import importlib

    hub_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")  # the module, not the class
    from transformers.utils import logging as hf_logging

    monkeypatch.setattr(hub_tqdm, "HF_HUB_DISABLE_PROGRESS_BARS", None)  # as read at import
    monkeypatch.setattr(hub_tqdm, "progress_bar_states", {})
    monkeypatch.setattr(hf_logging, "_tqdm_active", True)
    first = (examples_dir / "traces.jsonl").read_text(encoding="utf-8").splitlines()[0]
    traces = tmp_path / "one.jsonl"
    traces.write_text(first + "\n", encoding="utf-8")
    bundle = Path(__file__).parents[1] / "export" / "made_before" / "bundle"
    run = ["check", str(traces), "--bundle", str(bundle), "--engine", "hf", "-o"]
    with monkeypatch.context() as terminal:
        terminal.setattr(sys.stderr, "isatty", lambda: True)
        assert main([*run, str(tmp_path / "a.jsonl")]) == 0
    assert "Loading weights" in capfd.readouterr().err  # what the flag is to quiet
    assert main([*run, str(tmp_path / "b.jsonl"), "--no-progress"]) == 0
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "it/s" not in err, err
    assert hub_tqdm.are_progress_bars_disabled()
    monkeypatch.setattr(hub_tqdm, "progress_bar_states", {})  # on again, as at the start
    monkeypatch.setattr(hf_logging, "_tqdm_active", True)
    assert not hub_tqdm.are_progress_bars_disabled()
    assert main([*run, str(tmp_path / "c.jsonl")]) == 0  # stderr is captured: no terminal
    assert "Loading weights" not in capfd.readouterr().err


def test_check_and_label_close_their_local_judge(tmp_path, examples_dir, monkeypatch):
    """A local judge is closed when its command is done: on vLLM, its engine is shut down
    rather than killed at exit (where vLLM warns that its engine "exited unexpectedly")."""
    from stepgap.teacher.judges.hf import HFJudge

    closed = []
    monkeypatch.setattr(HFJudge, "close", lambda self: closed.append(self))
    first = (examples_dir / "traces.jsonl").read_text(encoding="utf-8").splitlines()[0]
    traces = tmp_path / "one.jsonl"
    traces.write_text(first + "\n", encoding="utf-8")
    bundle = Path(__file__).parents[1] / "export" / "made_before" / "bundle"
    common = [str(traces), "--engine", "hf", "--no-progress", "-o"]
    assert main(["check", *common, str(tmp_path / "c.jsonl"), "--bundle", str(bundle)]) == 0
    assert len(closed) == 1
    # its base model as a teacher judge: answers cut at 8 tokens, every step failed (exit 1)
    assert main(["label", *common, str(tmp_path / "l.jsonl"), "--judge", f"hf:{bundle / 'base'}",
                 "--max-tokens", "8", "--nli", f"replay:{examples_dir / 'nli_replay.jsonl'}"]) == 1  # fmt: skip
    assert len(closed) == 2 and closed[0] is not closed[1]


def test_label_baseline_and_mine_take_a_bundle(tmp_path, examples_dir, capsys):
    """`--bundle` wherever a checker is taken: `label` with the bundle's checker, `baseline`
    with its NLI model (and its student as the judge where one is needed), `mine` with its
    student, NLI model and thresholds; each as the same run with its parts named would be."""
    bundle = str(Path(__file__).resolve().parents[1] / "export" / "made_before" / "bundle")
    traces = str(examples_dir / "traces.jsonl")
    out = tmp_path / "label.jsonl"
    assert main(["label", traces, "--bundle", bundle, "--no-progress", "-o", str(out)]) == 0
    labelled = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(labelled) == 28 and all(v["label"] for v in labelled)
    nli_only = tmp_path / "nli_only.jsonl"
    assert main(["baseline", "nli-only", traces, "--bundle", bundle, "-o", str(nli_only)]) == 0
    assert len(nli_only.read_text().splitlines()) == 28
    capsys.readouterr()
    mined = tmp_path / "mined"
    pool = str(examples_dir / "teacher_verdicts.jsonl")
    assert main(["mine", pool, "--bundle", bundle, "-o", str(mined)]) == 0
    summary = json.loads((mined / "summary.json").read_text())
    assert summary["agreement"]["steps"] > 0 and summary["training_traces_dropped"] > 0
    assert main(["mine", pool, "--bundle", bundle, "--nli", "x", "-o", str(mined)]) == 2
    assert "drop --student, --nli" in capsys.readouterr().err


def test_the_libraries_notices_are_quiet_before_a_command_imports_them(monkeypatch, tmp_path):
    """bitsandbytes warns at import (its optional `kernels` package) on some CPUs: a command's
    parser imports transformers and TRL, so the quiet is set before the parser is made."""
    import logging

    from stepgap.cli import Command, main

    seen = []
    made = Command.make_parser
    monkeypatch.setattr(logging.getLogger("bitsandbytes"), "level", logging.NOTSET)

    def make_parser(self):
        seen.append(logging.getLogger("bitsandbytes").getEffectiveLevel())
        return made(self)

    monkeypatch.setattr(Command, "make_parser", make_parser)
    examples = Path(__file__).resolve().parents[2] / "examples"
    assert main(["segment", str(examples / "traces.jsonl"), "-o", str(tmp_path / "s.jsonl")]) == 0
    assert seen == [logging.ERROR]


def test_rollouts_feedback_flags_give_the_loop_the_reward_files_checker(
    tmp_path, monkeypatch, examples_dir
):
    """`--feedback typed --reward-config FILE --feedback-wait S`: the loop gets this process's
    inline checker over the file's reward, and the wait; by default it gets none."""
    import stepgap.data_builders.rollouts as rollouts_module
    from stepgap.data_builders.rollouts import RolloutSummary
    from stepgap.serving import inline, process_reward
    from stepgap.teacher.judges.replay import ReplayJudge

    given: list[dict] = []

    def run_rollouts(questions, policy, retriever, output, **options):
        given.append(options)
        return RolloutSummary(traces=1)

    monkeypatch.setattr(rollouts_module, "run_rollouts", run_rollouts)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    config = tmp_path / "reward.json"
    config.write_text(json.dumps({"judge": f"replay:{examples_dir / 'judge_replay.jsonl'}",
                                  "nli": f"replay:{examples_dir / 'nli_replay.jsonl'}"}))  # fmt: skip
    argv = ["rollouts", str(examples_dir / "rollout_questions.jsonl"), "--policy", "openai:m",
            "--retriever", "http://127.0.0.1:9/retrieve", "-o", str(tmp_path / "r.jsonl"),
            "--no-progress"]  # fmt: skip
    try:
        assert main(argv) == 0
        assert main([*argv, "--feedback", "typed", "--reward-config", str(config),
                     "--feedback-wait", "2.5"]) == 0  # fmt: skip
        off, on = given
        assert off["feedback"] is None and off["feedback_wait"] == 0.0
        assert isinstance(on["feedback"], inline.LocalInline) and on["feedback_wait"] == 2.5
        assert isinstance(on["feedback"].streaming.checker.judge, ReplayJudge)
    finally:
        inline.reset()
        process_reward.reset()


def failed_verdicts_file(examples_dir, path: Path, trace_id: str, steps: set[int]) -> Path:
    """The shipped teacher verdicts with the checks of `steps` of `trace_id` failed."""
    lines = []
    for line in (examples_dir / "teacher_verdicts.jsonl").read_text().splitlines():
        v = json.loads(line)
        if v["trace_id"] == trace_id and v["step"] in steps:
            v.update(label=None, repair=None, error="judge down")
        lines.append(json.dumps(v))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_reward_gives_a_trace_with_a_failed_check_no_reward_unless_zero(tmp_path, examples_dir):
    """As in training: `"reward": null` and why, never a number that looks typed; `--on-failed-
    check zero` writes the old reading (the failed steps at 0)."""
    verdicts = failed_verdicts_file(examples_dir, tmp_path / "v.jsonl", "case4-whiplash", {0, 2})
    traces = str(examples_dir / "traces.jsonl")
    rows = {}
    for reading in ("no_reward", "zero"):
        out = tmp_path / f"{reading}.jsonl"
        flag = [] if reading == "no_reward" else ["--on-failed-check", "zero"]
        assert main(["reward", traces, "--verdicts", str(verdicts), *flag, "-o", str(out)]) == 0
        rows[reading] = {r["trace_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    failed, zero = rows["no_reward"]["case4-whiplash"], rows["zero"]["case4-whiplash"]
    assert failed["reward"] is None and failed["failed_checks"] == 2
    assert failed["unavailable"] == "2 of 3 step check(s) failed (first: judge down)"
    assert zero["unavailable"] is None
    assert zero["reward"] == zero["em"] + zero["lam"] * sum(s["bracket"] for s in zero["steps"])
    assert [s["bracket"] for s in zero["steps"]][::2] == [0.0, 0.0]
    others = [tid for tid in rows["zero"] if tid != "case4-whiplash"]
    assert len(others) == 9
    for tid in others:  # the rest is scored alike both ways
        assert (
            rows["no_reward"][tid] == rows["zero"][tid] and rows["zero"][tid]["reward"] is not None
        )
