"""TRL, veRL and OpenRLHF signatures, called exactly as those frameworks call them."""

from __future__ import annotations

import asyncio

import pytest

from stepgap.serving import process_reward, verl
from stepgap.serving.trl import stepgap_async_reward_func, stepgap_reward_func


def _prompt(question: str) -> str:
    return f"Answer the question, searching when needed. Question: {question}\n"


def test_trl_plain_and_conversational_with_log_metric(reward, example_traces, expected_rewards):
    func = stepgap_reward_func(reward)
    assert func.__name__ == "stepgap_typed_shape"
    prompts = [_prompt(t.question) for t in example_traces]
    completions = [t.response for t in example_traces]
    golden = [t.golden_answers for t in example_traces]
    logged: dict[str, float] = {}
    out = func(
        prompts=prompts,
        completions=completions,
        completion_ids=[[1]] * len(prompts),
        golden_answers=golden,
        trainer_state=None,
        log_extra=lambda *a: None,
        log_metric=lambda name, value: logged.__setitem__(name, value),
    )
    assert out == pytest.approx([expected_rewards[t.id] for t in example_traces])
    assert {"stepgap/rate_CC", "stepgap/rate_IE", "stepgap/rate_MB", "stepgap/em",
            "stepgap/repair_rate"} <= set(logged)  # fmt: skip
    assert 0.0 <= logged["stepgap/repair_rate"] <= 1.0
    assert sum(logged[f"stepgap/rate_{k}"] for k in ("no_gap", "CC", "IE", "MB")) == pytest.approx(
        1
    )
    conv_prompts = [[{"role": "user", "content": p}] for p in prompts]
    conv_completions = [[{"role": "assistant", "content": c}] for c in completions]
    assert func(prompts=conv_prompts, completions=conv_completions, golden_answers=golden) == out
    afunc = stepgap_async_reward_func(reward)
    got = asyncio.run(afunc(prompts=prompts, completions=completions, golden_answers=golden))
    assert got == out


def test_trl_missing_answer_column_is_a_clear_error(reward):
    func = stepgap_reward_func(reward)
    with pytest.raises(ValueError, match="golden_answers"):
        func(prompts=["Question: q"], completions=["<answer>x</answer>"], solution=["x"])


def test_verl_compute_score_and_batch_signatures(reward, example_traces, expected_rewards):
    verl.configure(reward)
    try:
        t = example_traces[1]
        out = verl.compute_score(
            data_source="hotpotqa",
            solution_str=t.response,
            ground_truth={"target": t.golden_answers},
            extra_info={"question": t.question, "index": 0},
        )
        assert out["score"] == pytest.approx(expected_rewards[t.id])
        assert {"em", "rate_CC", "rate_IE", "rate_MB", "n_steps"} <= set(out)
        assert all(isinstance(v, float) for v in out.values())
        batch = verl.compute_score_batch(
            data_sources=["nq"] * len(example_traces),
            solution_strs=[x.response for x in example_traces],
            ground_truths=[{"target": x.golden_answers} for x in example_traces],
            extra_infos=[{"question": x.question} for x in example_traces],
        )
        assert [b["score"] for b in batch] == pytest.approx(
            [expected_rewards[x.id] for x in example_traces]
        )
        with pytest.raises(ValueError, match="extra_info"):
            verl.compute_score("nq", "<answer>x</answer>", "x", None)
    finally:
        process_reward.reset()


def test_verl_unconfigured_says_how_to_configure(monkeypatch):
    monkeypatch.delenv("STEPGAP_REWARD_URL", raising=False)
    monkeypatch.delenv("STEPGAP_REWARD_CONFIG", raising=False)
    process_reward.reset()
    with pytest.raises(RuntimeError, match="STEPGAP_REWARD_URL"):
        verl.compute_score("nq", "x", "y", {"question": "q"})


def test_verl_without_questions_fails_before_any_checker_is_asked(monkeypatch):
    """The question is checked first (an unconfigured reward would be the other error), and a
    `Question:` line in the response (a retrieved document's) is never taken for it."""
    monkeypatch.delenv("STEPGAP_REWARD_URL", raising=False)
    monkeypatch.delenv("STEPGAP_REWARD_CONFIG", raising=False)
    process_reward.reset()
    response = "<information>Question: what is 2+2? Answer: 4</information><answer>4</answer>"
    with pytest.raises(ValueError, match="`stepgap prepare-verl-data ") as error:
        verl.compute_score_batch(["nq"] * 2, [response] * 2, [["4"]] * 2,
                                 [{"question": "q?"}, {"split": "train", "index": 1}])  # fmt: skip
    assert "this row's extra_info has index, split" in str(error.value)


def test_openrlhf_inputs_without_labels_say_which_flag_sends_them():
    from stepgap.serving.openrlhf import openrlhf_batch

    with pytest.raises(ValueError, match=r"no labels .*--data\.label_key golden_answers"):
        openrlhf_batch(["q"], ["p"], None)
    with pytest.raises(ValueError, match="2 queries, 2 prompts and 1 labels"):
        openrlhf_batch(["q", "r"], ["p", "p"], [["a"]])


def test_a_prompt_without_a_question_line_is_scored_with_a_warning(monkeypatch, caplog):
    """Without Search-R1's `Question:` line the judge gets the whole user turn as the question:
    said once, in a warning naming where to give the question instead."""
    import logging

    from stepgap.serving import framework_inputs
    from stepgap.serving.openrlhf import openrlhf_batch

    monkeypatch.setattr(framework_inputs, "_WARNED_NO_QUESTION_LINE", False)
    prompt = "Answer the question below, searching as you need.\nWho wrote Ulysses?\n"
    with caplog.at_level(logging.WARNING, logger="stepgap.serving.framework_inputs"):
        _, questions, _ = openrlhf_batch([prompt + "<answer>Joyce</answer>"], [prompt], [["x"]])
        openrlhf_batch([prompt], [prompt], [["x"]])  # once a process
    assert questions == [prompt.strip()]
    said = [r.getMessage() for r in caplog.records if "no `Question:` line" in r.getMessage()]
    assert len(said) == 1 and "extra_info.question" in said[0]
    with caplog.at_level(logging.WARNING, logger="stepgap.serving.framework_inputs"):
        _, questions, _ = openrlhf_batch(["Question: Who?\nx"], ["Question: Who?\n"], [["x"]])
    assert questions == ["Who?"]
