"""Steps checked while veRL 0.9.1's own tool agent loop runs (`serving/verl_agent.py`).

The loop and the tool come from the shipped configs (`verl_agent_loop.yaml` through hydra, as
veRL's agent-loop worker instantiates it; `verl_search_tool.yaml` through veRL's
`initialize_tools_from_config`). The policy is scripted (a search agent's turns in Hermes
format, as the LLM server would return their tokens); the search tool asks a local BM25 index
behind the retrieval server; the judge is an OpenAI-compatible server on 127.0.0.1 and the NLI
the tiny DeBERTa. The reward the loop leaves on each rollout must be the post-hoc reward of the
same finished response, with every search step asked while the rollout ran.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import stepgap.serving
from stepgap.schema import Trace
from tests.fixtures.peers import import_peer

verl = import_peer("verl")

from tests.fixtures.live_server import LiveServer  # noqa: E402

SERVING = Path(stepgap.serving.__file__).parent
REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
pytestmark = pytest.mark.timeout(600)

TURN_SECONDS = 0.3  # the scripted policy's generation time per turn


@pytest.fixture(scope="module")
def tokenizer():
    """The Qwen2.5 vocabulary with Qwen2.5's own chat template (tools, tool responses)."""
    from tests.fixtures.models import qwen_tokenizer

    tok = qwen_tokenizer()
    tok.chat_template = (FIXTURES / "qwen2_5_chat_template.jinja").read_text(encoding="utf-8")
    return tok


@pytest.fixture(scope="module")
def rollouts(example_traces) -> list[dict]:
    """Each example trace as a search agent's turns: its claims, queries and answer."""
    out = []
    for t in example_traces:
        turns = []
        for s in t.steps:
            think = f"<think>{s.claim}</think>\n"
            if s.type == "conclusion":
                turns.append(f"{think}<answer> {s.answer} </answer>")
            elif s.query:
                call = {"name": "search", "arguments": {"query": s.query}}
                turns.append(f"{think}<tool_call>\n{json.dumps(call)}\n</tool_call>")
        if turns and turns[-1].count("<answer>"):
            out.append({"trace": t, "turns": turns})
    return out[:4]


class ScriptedServer:
    """veRL's LLM server client for a scripted policy: each rollout's next turn (by its
    question and the tool responses it has had), after `TURN_SECONDS`, as token ids."""

    def __init__(self, tokenizer, rollouts) -> None:
        self.tokenizer = tokenizer
        self.turns = {r["trace"].question: r["turns"] for r in rollouts}

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        await asyncio.sleep(TURN_SECONDS)
        text = self.tokenizer.decode(prompt_ids)
        question = next(q for q in self.turns if q in text)
        turn = self.turns[question][text.count("<tool_response>")]
        ids = self.tokenizer(turn + "<|im_end|>", add_special_tokens=False)["input_ids"]
        return TokenOutput(token_ids=ids, stop_reason="completed")


def trainer_config():
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": 1024,
                    "response_length": 4096,
                    "full_determinism": False,
                    "multi_turn": {
                        "enable": True,
                        "format": "hermes",
                        "max_user_turns": 8,
                        "max_assistant_turns": 8,
                        "max_parallel_calls": 1,
                        "max_tool_response_length": 4096,
                        "tool_response_truncate_side": "middle",
                    },
                }
            },
            "data": {},
        }
    )


def run_agent_loops(tokenizer, rollouts, retriever_url, monkeypatch, **loop_settings):
    """The rollouts through the shipped agent loop config, all at once, as veRL's agent-loop
    worker runs them; returns their outputs."""
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.tools.tool_registry import initialize_tools_from_config

    monkeypatch.setenv("STEPGAP_RETRIEVER_URL", retriever_url)
    tools = initialize_tools_from_config(str(SERVING / "verl_search_tool.yaml"))
    (loop_config,) = OmegaConf.load(SERVING / "verl_agent_loop.yaml")
    for key, value in loop_settings.items():
        loop_config[key] = value
    config = trainer_config()
    server = ScriptedServer(tokenizer, rollouts)

    async def one(r):
        loop = hydra.utils.instantiate(
            config=loop_config,
            trainer_config=DictConfigWrap(config=config),
            server_manager=server,
            tokenizer=tokenizer,
            processor=None,
            hf_model_type="qwen2",
            dataset_cls=None,
            data_config=DictConfigWrap(config.data),
            tools=ToolListWrap(tools),
        )
        t = r["trace"]
        return await loop.run(
            {"temperature": 1.0},
            raw_prompt=[
                {"role": "user", "content": f"Answer the question. Question: {t.question}"}
            ],
            extra_info={"question": t.question},
            reward_model={"ground_truth": {"target": t.golden_answers}},
        )

    async def all_of_them():
        return await asyncio.gather(*(one(r) for r in rollouts))

    return asyncio.run(all_of_them())


def post_hoc(reward, tokenizer, rollouts, outputs) -> list[float]:
    """The reward of each finished response, checked after the fact (a fresh checker run)."""
    texts = [tokenizer.decode(o.response_ids, skip_special_tokens=True) for o in outputs]
    results = reward.score(texts, [r["trace"].question for r in rollouts],
                           [r["trace"].golden_answers for r in rollouts])  # fmt: skip
    return [r.reward for r in results]


def test_the_agent_loop_checks_each_step_as_its_search_returns(
    inline_reward, tokenizer, rollouts, retriever_url, monkeypatch
):
    from stepgap.serving import inline, process_reward

    reward = inline_reward
    process_reward.configure(reward)
    outputs = run_agent_loops(tokenizer, rollouts, retriever_url, monkeypatch)
    (checker,) = inline._CHECKERS.values()
    stats = dict(checker.streaming.stats)
    judge = reward.checker.judge
    asked_inline = list(judge.asked)

    searches = sum(len(r["turns"]) - 1 for r in rollouts)
    assert all(o.reward_score is not None for o in outputs)
    assert stats["submitted"] == searches  # each search step, as its result came back
    assert stats["reused"] == searches and stats["asked_at_end"] == len(rollouts)
    assert len(asked_inline) == searches + len(rollouts)  # every step asked once
    for o in outputs:  # the search results reached the response, through the retriever
        text = tokenizer.decode(o.response_ids, skip_special_tokens=True)
        assert "<tool_response>\nDoc 1(Title: " in text
        assert o.extra_fields["reward_extra_info"]["score"] == o.reward_score

    judge.asked.clear()
    expected = post_hoc(reward, tokenizer, rollouts, outputs)
    assert [o.reward_score for o in outputs] == pytest.approx(expected, abs=1e-9)


def test_through_stepgap_serve_the_loop_sends_steps_and_gets_the_same_rewards(
    inline_reward, tokenizer, rollouts, retriever_url, monkeypatch
):
    import httpx

    from stepgap.serving.server import create_app

    reward = inline_reward
    with LiveServer(create_app(reward)) as url:
        outputs = run_agent_loops(tokenizer, rollouts, retriever_url, monkeypatch, stepgap_url=url)
        metrics = httpx.get(f"{url}/metrics").text
    searches = sum(len(r["turns"]) - 1 for r in rollouts)
    assert f'stepgap_requests_total{{route="steps"}} {float(searches)}' in metrics
    assert len(reward.checker.judge.asked) == searches + len(rollouts)
    reward.checker.judge.asked.clear()
    expected = post_hoc(reward, tokenizer, rollouts, outputs)
    assert [o.reward_score for o in outputs] == pytest.approx(expected, abs=1e-9)


def test_the_search_tool_config_needs_the_retrievers_address(monkeypatch, tmp_path):
    from verl.tools.tool_registry import initialize_tools_from_config

    config = tmp_path / "tool.yaml"
    text = (SERVING / "verl_search_tool.yaml").read_text(encoding="utf-8")
    config.write_text(text.replace("retrieval_service_url", "retrieval_url"), encoding="utf-8")
    with pytest.raises(ValueError, match="set config.retrieval_service_url in the tool config"):
        initialize_tools_from_config(str(config))


def test_a_finished_trace_of_the_loop_segments_into_its_scripted_steps(
    inline_reward, tokenizer, rollouts, retriever_url, monkeypatch
):
    """The steps the checker saw are the scripted ones: one per search, then the answer."""
    from stepgap.segment import segment_trace
    from stepgap.serving import process_reward

    process_reward.configure(inline_reward)
    outputs = run_agent_loops(tokenizer, rollouts[:1], retriever_url, monkeypatch)
    text = tokenizer.decode(outputs[0].response_ids, skip_special_tokens=True)
    steps = segment_trace(Trace(id="x", question="q", response=text)).steps
    scripted = rollouts[0]["trace"].steps
    assert [s.type for s in steps] == [s.type for s in scripted]
    assert [s.query for s in steps] == [s.query for s in scripted]
    assert all(s.evidence for s in steps if s.type != "conclusion")


def test_every_verl_override_in_the_docs_is_a_key_of_verls_trainer_config():
    """The `key=value` overrides of the veRL page's agent-loop command name keys of veRL's own
    PPO trainer config (a misspelt key fails veRL's start, far from the docs)."""
    import importlib.util
    import re

    from omegaconf import OmegaConf

    page = (REPO / "docs" / "rl" / "verl.md").read_text(encoding="utf-8")
    block = page[page.index("python -m verl.trainer.main_ppo ...") :].split("```")[0]
    overrides = re.findall(r"(actor_rollout_ref\.[\w.]+)=", block)
    assert len(overrides) == 6, block
    package = Path(importlib.util.find_spec("verl").origin).parent
    config = OmegaConf.load(package / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    for key in overrides:
        assert OmegaConf.select(config, key, default="missing") != "missing", key


def test_with_typed_feedback_each_gaps_note_goes_back_inside_its_tool_response(
    inline_reward, tokenizer, rollouts, retriever_url, monkeypatch
):
    """`stepgap_feedback: typed` with a wait long enough for every verdict: each tool message
    ends with the note of its step's post-hoc label (none for no_gap), the note's tokens are
    the environment's (response mask 0), and the rewards are the post-hoc rewards of the
    finished responses, notes and all."""
    import re

    from stepgap.feedback import note_for
    from stepgap.serving import process_reward

    process_reward.configure(inline_reward)
    outputs = run_agent_loops(tokenizer, rollouts, retriever_url, monkeypatch,
                              stepgap_feedback="typed", stepgap_feedback_wait=120)  # fmt: skip
    texts = [tokenizer.decode(o.response_ids, skip_special_tokens=True) for o in outputs]
    results = inline_reward.score(texts, [r["trace"].question for r in rollouts],
                                  [r["trace"].golden_answers for r in rollouts])  # fmt: skip
    sent = []
    for o, text, result in zip(outputs, texts, results, strict=True):
        expected = [note_for(s.label) for s in result.steps[:-1]]  # the searches' steps
        notes = re.findall(r"\n(<feedback>.*?</feedback>)\n</tool_response>", text)
        assert notes == [n for n in expected if n] and text.count("<feedback>") == len(notes)
        policy = [t for t, m in zip(o.response_ids, o.response_mask, strict=False) if m == 1]
        assert "<feedback>" not in tokenizer.decode(policy)
        info = o.extra_fields["reward_extra_info"]
        assert info["feedback/notes"] == len(notes) and info["feedback/too_late"] == 0
        assert o.reward_score == pytest.approx(result.reward, abs=1e-9)
        sent += notes
    assert sent  # some step is a gap
