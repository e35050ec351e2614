"""Fixtures for the teacher tests: a live fake OpenAI server loaded with the example answers."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from stepgap.data_builders import iter_traces
from stepgap.teacher.prompt import build_requests
from tests.fixtures.openai_server import FakeOpenAI, prompt_key


@pytest.fixture(scope="session")
def example_traces(examples_dir):
    return list(iter_traces(examples_dir / "traces.jsonl"))


@pytest.fixture(scope="session")
def example_prompts(example_traces, examples_dir) -> dict[tuple[str, int], str]:
    """(trace id, step) -> prompt key of the judge request the checker sends for it."""
    return {
        (r.trace_id, r.step): prompt_key(r.messages)
        for t in example_traces
        for r in build_requests(t.id, t.question, t.steps)
    }


@pytest.fixture(scope="session")
def example_answers(example_prompts, examples_dir) -> dict[str, dict]:
    """Prompt key -> the stored judge object for that step (examples/judge_replay.jsonl)."""
    answers = {}
    for line in (examples_dir / "judge_replay.jsonl").read_text().splitlines():
        rec = json.loads(line)
        answers[example_prompts[(rec["trace_id"], rec["step"])]] = rec["judge"]
    return answers


@pytest.fixture
def fake_openai(example_answers) -> Iterator[FakeOpenAI]:
    server = FakeOpenAI(answers=dict(example_answers)).start()
    yield server
    server.stop()
