"""Canary secrets through the distillation half of the life cycle, as a user runs it.

With canary API keys and Hub tokens in the environment and debug logging on, `sft-data`,
`train`, `export`, `check --bundle` and `push --dry-run` must leave no trace of them: not in
any file they write (data set, adapter, trainer state, bundle, manifest, model card), not in
anything they print (logs, the card, the push listing). The labeling half is covered by
tests/teacher/test_label.py::test_canary_api_key_never_reaches_logs_cache_or_verdicts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CANARIES = {
    "OPENAI_API_KEY": "sk-canary-openai-5c1d9e0a7b3f",
    "HF_TOKEN": "hf_canaryHubToken7Q2mZx9LwPe4",
    "HUGGING_FACE_HUB_TOKEN": "hf_canaryLegacyToken3Vb8Kd1Ns",
    "WANDB_API_KEY": "canary-wandb-0f9e8d7c6b5a4f3e",
}


# The five commands in one process (as `examples/demo.py` runs them), each through the CLI's
# own entry point with its logging set up afresh: one interpreter start, not five.
RUNNER = """
import json, sys
from stepgap.cli import main
for argv in json.loads(sys.argv[1]):
    print(f"$ stepgap {' '.join(argv)}", flush=True)
    if main(["-vv", *argv]) != 0:
        sys.exit(f"stepgap {argv[0]} failed")
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_canary_secrets_never_reach_data_adapters_bundles_cards_or_logs(
    tmp_path, examples_dir, tiny_nli
):
    sft, student, bundle = tmp_path / "sft", tmp_path / "student", tmp_path / "bundle"
    commands = [
        ["sft-data", str(examples_dir / "teacher_verdicts.jsonl"), "-o", str(sft)],
        ["train", "--config", "student/configs/tiny.yaml", "--set", f"output_dir={student}",
         "--set", f"dataset={sft}", "--set", "max_steps=2", "--set", "save_steps=1"],
        ["export", "--student", str(student), "--nli", str(tiny_nli), "-o", str(bundle),
         "--merge", "--nli-quantize", "int8"],
        ["check", str(examples_dir / "traces.jsonl"), "--bundle", str(bundle),
         "-o", str(tmp_path / "verdicts.jsonl")],
        ["push", str(bundle), "--repo-id", "someone/stepgap-checker", "--dry-run"],
    ]  # fmt: skip
    env = {**os.environ, **CANARIES, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(commands)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logs = [done.stdout, done.stderr]
    assert done.stdout.count("$ stepgap ") == len(commands)
    printed = "\n".join(logs)
    assert "model.onnx" in printed and "---" in printed  # the listing and the card were printed
    assert "DEBUG" in printed  # debug logging was on
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "manifest.json" for p in files) and any(
        p.name == "trainer_state.json" for p in files
    )
    for name, canary in CANARIES.items():
        assert canary not in printed, f"{name} printed"
        for path in files:
            assert canary.encode() not in path.read_bytes(), f"{name} in {path}"
