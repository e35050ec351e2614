"""TRL's own tool loop with stepgap's `SearchEnvironment` and the async reward function: a tiny
policy (trained to make the examples' searches as Hermes tool calls, with Qwen2.5's chat
template) calls the `search` tool inside `GRPOTrainer`, the tool asks a local BM25 index
behind the retrieval server, and the reward scores every search of the tool-calling
completion as a step: the post-hoc reward of the completion's whole text."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepgap.data_builders.rollout_formats import HERMES_TEMPLATE, question_text
from tests.fixtures.models import build_search_policy

trl = pytest.importorskip("trl", reason="the train extra")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
QWEN25 = (FIXTURES / "qwen2_5_chat_template.jinja").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def conversations(example_traces, retriever_url):
    """The first example trace that searches, as a tool-calling conversation: each search a
    `search` tool call whose response is what the local retriever answers, then the answer
    (one trace keeps the policy's training to seconds)."""
    from stepgap.serving.trl import SearchEnvironment

    env = SearchEnvironment(retriever_url)
    out = []
    for t in example_traces:
        if "<tool_call>" in t.response or sum(s.type == "inference" for s in t.steps) < 1:
            continue
        messages = []
        for s in t.steps:
            think = f"<think>{s.claim}</think>"
            if s.type == "conclusion":
                messages.append(
                    {"role": "assistant", "content": f"{think}\n<answer> {s.answer} </answer>"}
                )
            elif s.query:
                call = {
                    "type": "function",
                    "function": {"name": "search", "arguments": {"query": s.query}},
                }
                messages.append({"role": "assistant", "content": think, "tool_calls": [call]})
                messages.append({"role": "tool", "name": "search", "content": env.search(s.query)})
        if messages[-1]["role"] == "assistant" and "<answer>" in messages[-1]["content"]:
            out.append({"trace": t, "prompt": HERMES_TEMPLATE.format(question=question_text(t.question)),
                        "messages": messages})  # fmt: skip
    return out[:1]


@pytest.fixture(scope="module")
def tool_policy(tmp_path_factory, conversations, retriever_url):
    """A tiny Qwen2 with Qwen2.5's chat template that writes those conversations' assistant
    turns back, greedily, given the same tool responses."""
    from transformers.utils import get_json_schema

    from stepgap.serving.trl import SearchEnvironment

    return build_search_policy(
        tmp_path_factory.mktemp("tool-policy"),
        [(c["prompt"], c["messages"]) for c in conversations],
        steps=600,
        chat_template=QWEN25,
        tools=[get_json_schema(SearchEnvironment(retriever_url).search)],
    )


def _one_grpo_step(conversations, tmp_path):
    """The data set's rows (each conversation's prompt, question and golden answers) and a
    GRPO config of one greedy step, two rollouts a prompt, up to four tool calls each."""
    from trl import GRPOConfig

    rows = [{"prompt": [{"role": "user", "content": c["prompt"]}], "question": c["trace"].question,
             "golden_answers": c["trace"].golden_answers} for c in conversations]  # fmt: skip
    config = GRPOConfig(
        output_dir=str(tmp_path / "grpo"), max_steps=1, per_device_train_batch_size=2,
        num_generations=2, max_completion_length=600, temperature=1e-3, learning_rate=1e-5,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
        seed=0, max_tool_calling_iterations=4,
    )  # fmt: skip
    return rows, config


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_trls_tool_loop_searches_and_every_search_is_a_step(
    tool_policy, conversations, inline_reward, retriever_url, tmp_path, monkeypatch
):
    from datasets import Dataset
    from trl import GRPOTrainer

    from stepgap.segment import segment_response
    from stepgap.serving.framework_inputs import text_of
    from stepgap.serving.trl import SearchEnvironment, stepgap_async_reward_func

    monkeypatch.setenv("STEPGAP_RETRIEVER_URL", retriever_url)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    seen: list[dict] = []
    reward_func = stepgap_async_reward_func(inline_reward)

    async def recording(prompts, completions, **kwargs):
        rewards = await reward_func(prompts, completions, **kwargs)
        seen.extend({"completion": c, "reward": r, "question": q}
                    for c, r, q in zip(completions, rewards, kwargs["question"], strict=True))  # fmt: skip
        return rewards

    recording.__name__ = reward_func.__name__
    rows, config = _one_grpo_step(conversations, tmp_path)
    trainer = GRPOTrainer(
        model=str(tool_policy),
        reward_funcs=[recording],
        args=config,
        train_dataset=Dataset.from_list(rows),
        environment_factory=SearchEnvironment,
    )
    trainer.train()

    assert seen
    for s in seen:  # TRL's loop called the tool: each completion holds its searches' results
        messages = s["completion"]
        tools = [m for m in messages if m["role"] == "tool"]
        assert tools and all("Doc 1(Title: " in m["content"] for m in tools), messages
        (expected,) = inline_reward.score(
            [text_of(messages)], [s["question"]],
            [next(c["trace"].golden_answers for c in conversations
                  if c["trace"].question == s["question"])],
        )  # fmt: skip
        assert expected.reward == pytest.approx(s["reward"], abs=1e-9)
        assert len(expected.steps) == len(tools) + 1  # every search a step, then the answer
        # the policy wrote its trace's turns back: the steps read from the completion are the
        # trace's own (claims from TRL's reasoning_content, queries from its tool calls)
        trace = next(c["trace"] for c in conversations if c["trace"].question == s["question"])
        steps = segment_response(text_of(messages))
        assert [(st.claim, st.query) for st in steps] == [
            (st.claim, st.query) for st in trace.steps
        ]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_with_typed_feedback_each_gaps_note_goes_back_with_its_search(
    tool_policy, conversations, inline_reward, retriever_url, tmp_path, monkeypatch
):
    """`StepGapGRPOTrainer` with `SearchEnvironment(feedback="typed")` and a wait long enough
    for every verdict: each tool message TRL's loop appends ends with the note of its step's
    post-hoc label (none for no_gap), and TRL logs the notes sent per rollout."""
    from functools import partial

    from datasets import Dataset

    from stepgap.feedback import note_for
    from stepgap.serving import process_reward
    from stepgap.serving.framework_inputs import text_of
    from stepgap.serving.trl import SearchEnvironment, stepgap_async_reward_func
    from stepgap.serving.trl_trainer import StepGapGRPOTrainer

    monkeypatch.setenv("STEPGAP_RETRIEVER_URL", retriever_url)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    process_reward.configure(inline_reward)  # the environments' inline checker
    seen: list[dict] = []
    reward_func = stepgap_async_reward_func(inline_reward)

    async def recording(prompts, completions, **kwargs):
        seen.extend({"completion": c, "question": q}
                    for c, q in zip(completions, kwargs["question"], strict=True))  # fmt: skip
        return await reward_func(prompts, completions, **kwargs)

    recording.__name__ = reward_func.__name__
    rows, config = _one_grpo_step(conversations, tmp_path)
    trainer = StepGapGRPOTrainer(
        model=str(tool_policy), reward_funcs=[recording], args=config,
        train_dataset=Dataset.from_list(rows),
        environment_factory=partial(SearchEnvironment, feedback="typed", feedback_wait=120),
    )  # fmt: skip
    trainer.train()

    sent = []
    for s in seen:
        messages = s["completion"]
        tools = [m["content"] for m in messages if m["role"] == "tool"]
        golden = next(c["trace"].golden_answers for c in conversations
                      if c["trace"].question == s["question"])  # fmt: skip
        (result,) = inline_reward.score([text_of(messages)], [s["question"]], [golden])
        expected = [note_for(st.label) for st in result.steps[: len(tools)]]
        assert [
            t.endswith(f"\n{n}") if n else "<feedback>" not in t
            for t, n in zip(tools, expected, strict=True)
        ] == [True] * len(tools)
        sent += [n for n in expected if n]
    assert sent  # some step is a gap
    (logged,) = [h for h in trainer.state.log_history if "stepgap/feedback_notes" in h]
    assert logged["stepgap/feedback_notes"] == pytest.approx(len(sent) / len(seen))
    assert logged["stepgap/feedback_too_late"] == 0
