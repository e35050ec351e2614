"""A real checker for the reward tests: the openai judge against the fake server, replayed NLI.

The judge prompt does not contain the trace id, so any rollout whose response equals an example
trace's response gets the example's judge answers, and its reward can be compared exactly with
the reward computed from the example's stored verdicts.
"""

from __future__ import annotations

import pytest

from stepgap.serving import StepGapReward, compute_reward
from stepgap.teacher import Checker, ReplayJudge, ReplayNLI, load_judge


@pytest.fixture
def reward(fake_openai, examples_dir):
    judge = load_judge("openai:gpt-4.1-mini", base_url=fake_openai.base_url, max_retries=0)
    checker = Checker(judge, ReplayNLI.from_file(examples_dir / "nli_replay.jsonl"))
    return StepGapReward(checker)


@pytest.fixture(scope="session")
def expected_rewards(example_traces, examples_dir) -> dict[str, float]:
    """trace id -> reward from the stored (replayed) verdicts of the example traces."""
    checker = Checker(
        ReplayJudge.from_file(examples_dir / "judge_replay.jsonl"),
        ReplayNLI.from_file(examples_dir / "nli_replay.jsonl"),
    )
    return {
        t.id: compute_reward(t, vs).reward
        for t, vs in zip(example_traces, checker.check(example_traces), strict=True)
    }


@pytest.fixture
def served(reward):
    """A live `stepgap serve` app (openai judge on the fake server, replayed NLI)."""
    from stepgap.serving import configured
    from stepgap.serving.server import create_app
    from tests.fixtures.live_server import LiveServer

    configured.reset()
    with LiveServer(create_app(reward, max_batch=16, max_wait_ms=5)) as url:
        yield url
    configured.reset()


def chat_prompt(question: str) -> str:
    """A rollout's prompt as the tiny Qwen2's chat template writes it."""
    return f"<|im_start|>user\nQuestion: {question}<|im_end|>\n<|im_start|>assistant\n"
