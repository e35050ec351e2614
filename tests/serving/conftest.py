"""A real checker for the reward tests: the openai judge against the fake server, replayed NLI.

The judge prompt does not contain the trace id, so any rollout whose response equals an example
trace's response gets the example's judge answers, and its reward can be compared exactly with
the reward computed from the example's stored verdicts.
"""

from __future__ import annotations

import json
import re

import pytest

from stepgap.reward_arithmetic import compute_reward
from stepgap.serving import StepGapReward
from stepgap.teacher import Checker, ReplayJudge, ReplayNLI, build_judge, load_nli
from tests.fixtures.judges import CountingJudge
from tests.fixtures.live_server import LiveServer
from tests.fixtures.openai_server import FakeOpenAI


@pytest.fixture
def reward(fake_openai, examples_dir):
    judge = build_judge(
        "openai:gpt-4.1-mini", base_url=fake_openai.base_url, max_retries=0, no_cache=True
    )
    checker = Checker(judge, ReplayNLI.from_file(examples_dir / "nli_replay.jsonl"))
    return StepGapReward(checker)


@pytest.fixture(scope="session")
def expected_rewards(example_traces, examples_dir) -> dict[str, float]:
    """trace id -> reward from the stored (replayed) verdicts of the example traces.

    The adapters' oracle is the reward computed without them, by `compute_reward` on the same
    verdicts: an adapter only carries inputs in and rewards out, and must change nothing. The
    reward's arithmetic has its own oracle, the contract's hand-computed cases
    (tests/test_reward_arithmetic.py)."""
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
    from stepgap.serving import process_reward
    from stepgap.serving.server import create_app

    process_reward.reset()
    with LiveServer(create_app(reward, max_batch=16, max_wait_ms=5)) as url:
        yield url
    process_reward.reset()


def chat_prompt(question: str) -> str:
    """A rollout's prompt as the tiny Qwen2's chat template writes it."""
    return f"<|im_start|>user\nQuestion: {question}<|im_end|>\n<|im_start|>assistant\n"


# --------------------------------------------------------------- rollouts checked as they run
@pytest.fixture(scope="module")
def scripts(example_traces) -> list[dict]:
    """A scripted Search-R1 policy's turns: each example trace's text up to each `</search>`
    and to its `</answer>` (four traces with a search and an answer)."""
    out = []
    for t in example_traces:
        model_text = re.sub(r"\s*<information>.*?</information>\s*", "\n", t.response, flags=re.S)
        turns = [m.group(0) for m in re.finditer(r".*?</(search|answer)>", model_text, re.S)]
        if turns and turns[-1].endswith("</answer>") and len(turns) >= 2:
            out.append({"trace": t, "turns": turns})
    return out[:4]


@pytest.fixture(scope="module")
def retriever_url(example_traces, tmp_path_factory):
    """`stepgap retrieval serve` over a BM25 index of the example traces' evidence: a search
    agent's tool asks it as it would ask Search-R1's retriever."""
    pytest.importorskip("bm25s", reason="the retrieval extra")
    from stepgap.data_builders.retrieval import LocalIndex, build_index, make_contents
    from stepgap.serving.retrieval_server import create_app

    folder = tmp_path_factory.mktemp("retriever")
    passages = {(e.title, e.text) for t in example_traces for s in t.steps for e in s.evidence}
    rows = [{"id": str(i), "contents": make_contents(title, text)}
            for i, (title, text) in enumerate(sorted(passages))]  # fmt: skip
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    build_index(corpus, folder / "index", kind="bm25", progress=False)
    with LiveServer(create_app(LocalIndex(folder / "index"))) as url:
        yield f"{url}/retrieve"


@pytest.fixture(scope="module")
def any_judge_server(example_answers):
    """An OpenAI-compatible judge on 127.0.0.1 that answers any prompt with a stored judge
    object (new rollouts' steps have prompts no example has)."""
    server = FakeOpenAI(answers=dict(example_answers), answer_any=True).start()
    yield server
    server.stop()


@pytest.fixture
def inline_reward(any_judge_server, tiny_nli):
    """A reward for new rollouts: that judge (counting what it is asked) and the tiny NLI.
    This process's configured reward and inline checkers are reset around each test."""
    from stepgap.serving import inline, process_reward

    judge = build_judge(
        "openai:gpt-4.1-mini", base_url=any_judge_server.base_url, max_retries=0, no_cache=True
    )
    inline.reset()
    process_reward.reset()
    yield StepGapReward(Checker(CountingJudge(judge), load_nli(str(tiny_nli))))
    inline.reset()
    process_reward.reset()
