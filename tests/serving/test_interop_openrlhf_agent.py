"""Steps checked while OpenRLHF 0.11.2's own multi-turn agent executor runs
(`serving/openrlhf_agent.py`, loaded as `--train.agent_func_path` loads it).

The policy is scripted (each example trace's Search-R1 turns, as vLLM would return them); the
search asks a local BM25 index behind the retrieval server; the judge is an OpenAI-compatible
server on 127.0.0.1 and the NLI the tiny DeBERTa. Each rollout's reward must be the post-hoc
reward OpenRLHF's reward path would give its finished text, with every search step asked while
the rollout ran.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import stepgap.serving
from stepgap.data_builders.rollout_formats import SEARCH_R1_TEMPLATE
from tests.fixtures.peers import import_peer

import_peer("openrlhf")

from tests.fixtures.live_server import LiveServer  # noqa: E402

SERVING = Path(stepgap.serving.__file__).parent
pytestmark = pytest.mark.timeout(600)
TURN_SECONDS = 0.3


def load_agent_executor(path: Path):
    """OpenRLHF's own `_load_agent_executor` (`openrlhf/trainer/ray/vllm_engine.py`), run as
    written: that module imports vLLM, which the interop extra leaves out, so the function's
    source is taken from it and run beside the one import it uses."""
    from openrlhf.utils.agent import AgentExecutorBase

    package = Path(importlib.util.find_spec("openrlhf").origin).parent
    source = package / "trainer" / "ray" / "vllm_engine.py"  # not imported: its package is
    tree = ast.parse(source.read_text(encoding="utf-8"))
    (func,) = [n for n in tree.body if getattr(n, "name", None) == "_load_agent_executor"]
    namespace = {"AgentExecutorBase": AgentExecutorBase}
    exec(compile(ast.Module([func], []), str(source), "exec"), namespace)
    return namespace["_load_agent_executor"](str(path))


@pytest.fixture(scope="module")
def tokenizer():
    from tests.fixtures.models import qwen_tokenizer

    return qwen_tokenizer()


def prompt_of(question: str) -> str:
    """Search-R1's prompt in the chat template, as OpenRLHF's dataset renders it."""
    content = SEARCH_R1_TEMPLATE.format(question=question)
    return f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"


class ScriptedEngine:
    """vLLM's engine for a scripted policy: the next turn of the rollout (by its question and
    the search results it has had), after `TURN_SECONDS`; it checks the turns stop as
    Search-R1's do."""

    def __init__(self, tokenizer, scripts) -> None:
        self.tokenizer = tokenizer
        self.turns = {s["trace"].question: s["turns"] for s in scripts}

    async def generate(self, prompt_ids, sampling_params, multi_modal_data=None):
        assert {"</search>", "</answer>"} <= set(sampling_params.stop)
        await asyncio.sleep(TURN_SECONDS)
        text = self.tokenizer.decode(prompt_ids)
        question = next(q for q in self.turns if q in text)
        turn = self.turns[question][text.count("</information>\n\n")]
        ids = self.tokenizer(turn, add_special_tokens=False)["input_ids"]
        output = SimpleNamespace(token_ids=ids, text=turn, finish_reason="stop", logprobs=None)
        return SimpleNamespace(outputs=[output])


def run_rollouts(tokenizer, scripts, retriever_url, monkeypatch):
    monkeypatch.setenv("STEPGAP_RETRIEVER_URL", retriever_url)
    executor = load_agent_executor(SERVING / "openrlhf_agent.py")
    engine = ScriptedEngine(tokenizer, scripts)

    async def all_of_them():
        return await asyncio.gather(
            *(
                executor.execute(
                    prompt_of(s["trace"].question),
                    s["trace"].golden_answers,
                    SimpleNamespace(max_tokens=None, logprobs=None, stop=None),
                    4096,
                    tokenizer,
                    engine,
                )  # fmt: skip
                for s in scripts
            )
        )

    return asyncio.run(all_of_them())


def post_hoc(reward, tokenizer, outputs) -> list[float]:
    """The rewards OpenRLHF's reward path gives the finished texts, checked after the fact."""
    from stepgap.serving.openrlhf import openrlhf_batch

    queries = [tokenizer.decode(o["observation_tokens"]) for o in outputs]
    responses, questions, golden = openrlhf_batch(
        queries, [o["prompt"] for o in outputs], [o["label"] for o in outputs]
    )
    return [r.reward for r in reward.score(responses, questions, golden)]


def test_openrlhfs_executor_checks_each_step_as_its_search_returns(
    inline_reward, tokenizer, scripts, retriever_url, monkeypatch
):
    from stepgap.serving import inline, process_reward

    process_reward.configure(inline_reward)
    outputs = run_rollouts(tokenizer, scripts, retriever_url, monkeypatch)
    (checker,) = inline._CHECKERS.values()
    stats = dict(checker.streaming.stats)
    judge = inline_reward.checker.judge

    searches = sum(len(s["turns"]) - 1 for s in scripts)
    assert stats["submitted"] == searches and stats["reused"] == searches
    assert stats["asked_at_end"] == len(scripts)
    assert len(judge.asked) == searches + len(scripts)
    for o in outputs:
        text = tokenizer.decode(o["observation_tokens"])
        assert text.count("<information>Doc 1(Title: ") == len(o["action_ranges"]) - 1
        assert o["reward"] == o["scores"] and set(o["extra_logs"]) >= {"em", "rate_CC"}

    judge.asked.clear()
    expected = post_hoc(inline_reward, tokenizer, outputs)
    assert [o["reward"] for o in outputs] == pytest.approx(expected, abs=1e-9)


def test_through_stepgap_serve_the_executor_gets_the_same_rewards(
    inline_reward, tokenizer, scripts, retriever_url, monkeypatch
):
    import httpx

    from stepgap.serving.server import create_app

    with LiveServer(create_app(inline_reward)) as url:
        monkeypatch.setenv("STEPGAP_REWARD_URL", url)
        outputs = run_rollouts(tokenizer, scripts, retriever_url, monkeypatch)
        metrics = httpx.get(f"{url}/metrics").text
    searches = sum(len(s["turns"]) - 1 for s in scripts)
    assert f'stepgap_requests_total{{route="steps"}} {float(searches)}' in metrics
    assert len(inline_reward.checker.judge.asked) == searches + len(scripts)
    inline_reward.checker.judge.asked.clear()
    expected = post_hoc(inline_reward, tokenizer, outputs)
    assert [o["reward"] for o in outputs] == pytest.approx(expected, abs=1e-9)


def test_with_typed_feedback_each_gaps_note_follows_its_information_and_the_rewards_hold(
    inline_reward, tokenizer, scripts, retriever_url, monkeypatch
):
    """`STEPGAP_FEEDBACK=typed` with a wait long enough for every verdict: each search's
    `<information>` goes back with the note of its step's post-hoc label (none for no_gap),
    the rollout's logs count them, and the rewards are the post-hoc rewards of the finished
    texts, notes and all."""
    from stepgap.feedback import note_for
    from stepgap.serving import process_reward
    from stepgap.serving.openrlhf import openrlhf_batch

    process_reward.configure(inline_reward)
    monkeypatch.setenv("STEPGAP_FEEDBACK", "typed")
    monkeypatch.setenv("STEPGAP_FEEDBACK_WAIT", "120")
    outputs = run_rollouts(tokenizer, scripts, retriever_url, monkeypatch)
    queries = [tokenizer.decode(o["observation_tokens"]) for o in outputs]
    responses, questions, golden = openrlhf_batch(
        queries, [o["prompt"] for o in outputs], [o["label"] for o in outputs]
    )
    sent = []
    for o, result, text in zip(outputs, inline_reward.score(responses, questions, golden),
                               responses, strict=True):  # fmt: skip
        expected = [note_for(s.label) for s in result.steps[:-1]]  # the searches' steps
        notes = re.findall(r"</information>\n\n(<feedback>.*?</feedback>)\n\n", text)
        assert notes == [n for n in expected if n] and text.count("<feedback>") == len(notes)
        assert o["extra_logs"]["feedback/notes"] == len(notes)
        assert o["extra_logs"]["feedback/too_late"] == 0
        assert o["reward"] == pytest.approx(result.reward, abs=1e-9)
        sent += notes
    assert sent  # some step is a gap
