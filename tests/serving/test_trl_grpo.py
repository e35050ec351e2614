"""A real GRPO run in TRL's own `GRPOTrainer` with the stepgap reward: rewards vary within a
group (so advantages are not zero), and the policy's weights move."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stepgap.data_builders.rollout_formats import SEARCH_R1_TEMPLATE, question_text
from tests.fixtures.models import build_search_policy

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def search_policy(tmp_path_factory, example_traces):
    """A tiny Qwen2 taught to write the examples' Search-R1 responses: sampled at temperature 1
    it writes tagged, varied completions, some right and some wrong."""
    pairs = [
        (SEARCH_R1_TEMPLATE.format(question=question_text(t.question)), t.response)
        for t in example_traces
        if "<tool_call>" not in t.response
    ]
    return build_search_policy(
        tmp_path_factory.mktemp("policy"),
        pairs,
        steps=100,  # 60 already give varied rewards and 9 judge calls; 100 keep a margin
        learn_information=True,
        require_exact=False,
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grpo_trains_on_varied_stepgap_rewards(search_policy, tiny_nli, fake_openai, tmp_path):
    from safetensors.torch import load_file

    fake_openai.answer_any = True  # a judge answer for every new step the policy writes
    out = tmp_path / "grpo"
    cmd = [
        sys.executable, str(REPO / "examples" / "grpo_trl.py"), "--model", str(search_policy),
        "--judge", "openai:gpt-4.1-mini", "--base-url", fake_openai.base_url,
        "--nli", str(tiny_nli), "--steps", "2", "--num-generations", "4",
        "--max-completion-length", "200", "--temperature", "1.0", "--learning-rate", "1e-3",
        "--output", str(out),
        "--cpu",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    history = json.loads((out / "log_history.json").read_text())
    steps = [row for row in history if "rewards/stepgap_typed_shape/mean" in row]
    assert [row["step"] for row in steps] == [1, 2]
    # the completions of a group did not all get one reward: GRPO had advantages to learn from
    assert max(row["rewards/stepgap_typed_shape/std"] for row in steps) > 0
    assert all("stepgap/rate_IE" in row and "stepgap/em" in row for row in steps)
    assert len(fake_openai.answered()) > 0  # the judge was asked about the tagged steps
    before = load_file(search_policy / "model.safetensors")
    after = load_file(out / "model.safetensors")
    moved = [k for k in before if not (before[k] == after[k]).all()]
    assert moved, "GRPO left every weight of the policy unchanged"
