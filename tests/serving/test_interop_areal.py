"""The reward through AReaL 1.0.4's own code: its `AsyncRewardWrapper` (a process pool, a
timeout that it turns into a reward of 0) and its `RLVRWorkflow` over `stepgap.serving.areal`,
against a live `stepgap serve` with the suite's judge. AReaL's pins (transformers <=5.3, torch
<2.11) keep it out of the suite's venv: `make test-peers` runs this file in `.venv-areal`, and
the server whose NLI model it needs in stepgap's own venv, as the docs say to run it.
Rewards must equal `StepGapReward.score` on the same texts; a failed or late check must raise,
never come back as 0."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from stepgap.serving import areal as adapter
from stepgap.serving.reward_function import RewardUnavailable
from tests.fixtures.live_server import StepgapServe
from tests.fixtures.peers import import_peer
from tests.serving.conftest import chat_prompt

import_peer("areal")
from areal.api.reward_api import AsyncRewardWrapper  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def fresh_pools():
    """AReaL's process pools are shared by the class and live for the process: each test gets
    new workers, forked with its own environment and server."""
    adapter._PACED.clear()
    yield
    AsyncRewardWrapper._atexit_shutdown_all()
    adapter._PACED.clear()


# stepgap's own venv (`make install`), where `stepgap serve` runs beside AReaL's, as the docs
# say: AReaL's transformers (5.3) loads DeBERTa's tokenizer without [CLS]/[SEP], and stepgap
# refuses an NLI model there.
OWN_VENV = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "python"


@pytest.fixture(scope="module")
def own_venv_nli(tmp_path_factory) -> Path:
    """The tiny NLI stand-in, built in stepgap's own venv."""
    if not OWN_VENV.exists():
        pytest.fail(f"stepgap's own venv is missing ({OWN_VENV}): `make install` builds it")
    folder = tmp_path_factory.mktemp("nli")
    build = (
        f"from tests.fixtures.models import build_deberta_nli; build_deberta_nli({str(folder)!r})"
    )
    subprocess.run([str(OWN_VENV), "-c", build], cwd=OWN_VENV.parents[2], check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=900)  # fmt: skip
    return folder


@pytest.fixture
def probed(own_venv_nli, any_judge_server, tmp_path):
    """A `stepgap serve` in stepgap's own venv whose judge answers any prompt, the probe
    rollout of a pace check too (`any_judge_server`), with the tiny NLI."""
    args = ["--judge", "openai:gpt-4.1-mini", "--base-url", any_judge_server.base_url,
            "--no-cache", "--max-retries", "0", "--nli", str(own_venv_nli),
            "--max-batch", "16", "--max-wait-ms", "5"]  # fmt: skip
    with StepgapServe(args, tmp_path / "serve.log", python=OWN_VENV) as server:
        yield server.url


def served_results(url: str, texts, traces) -> list[dict]:
    """`StepGapReward.score`'s results for `texts` (the traces' questions and golden answers),
    as the server's `/reward` gives them."""
    body = {"responses": list(texts), "questions": [t.question for t in traces],
            "golden_answers": [t.golden_answers for t in traces]}  # fmt: skip
    answer = httpx.post(f"{url}/reward", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    return answer.json()["results"]


def rows(traces) -> list[tuple[str, str, dict]]:
    """(prompt, completion, row) per trace, as RLVRWorkflow passes them: the question from the
    prompt's `Question:` line, or from the row's `question` field; golden answers as
    `golden_answers`, or `answer`."""
    out = []
    for i, t in enumerate(traces):
        if i % 2:
            prompt, row = "<|im_start|>user\nAnswer it.<|im_end|>\n", {"question": t.question}
        else:
            prompt, row = chat_prompt(t.question), {}
        row["answer" if i % 3 == 1 else "golden_answers"] = t.golden_answers
        out.append((prompt, t.response, row))
    return out


def run_wrapper(wrapper, items) -> list:
    async def main():
        calls = [wrapper(p, c, [1, 2], [3], **row) for p, c, row in items]
        return await asyncio.gather(*calls, return_exceptions=True)

    return asyncio.run(main())


def test_areal_wrapper_gives_the_typed_rewards_from_serve(
    served, reward, example_traces, monkeypatch
):
    """AReaL's wrapper, at its default 15 s, over the function by name (settings from the
    environment) and over the class (settings in its attributes): `StepGapReward.score`'s
    rewards on the same texts, each carrying its logs across the process pool."""
    items = rows(example_traces)
    expected = [
        r.reward
        for r in reward.score(
            [t.response for t in example_traces],
            [t.question for t in example_traces],
            [t.golden_answers for t in example_traces],
        )
    ]
    assert all(e is not None for e in expected)
    monkeypatch.setenv("STEPGAP_REWARD_URL", served)
    # AReaL's timeout at 60 s, not its 15: on a loaded machine a check may take longer, and the
    # subject here is the reward (the timeouts have tests of their own)
    monkeypatch.setenv("STEPGAP_AREAL_TIMEOUT", "60")
    by_name = run_wrapper(AsyncRewardWrapper(adapter.reward_fn, 60, max_workers=2), items)
    by_class = run_wrapper(
        AsyncRewardWrapper(adapter.AReaLReward(url=served, areal_timeout=60), 60, max_workers=3),
        items,
    )
    for got in (by_name, by_class):
        assert [type(g) for g in got] == [adapter.StepGapScore] * len(items), got
        assert max(abs(g - e) for g, e in zip(got, expected, strict=True)) <= 1e-9
        assert {"rate_CC", "failed_checks", "em", "repair_rate"} <= set(got[0].logs)
    assert adapter.AReaLReward(url=served).check_pace(probe=False) is not None  # measured


def test_a_failed_check_raises_through_areal_never_zero(served, fake_openai, example_traces):
    """The judge answers 500 to everything: each rollout has no reward, and AReaL's wrapper,
    after its retries, raises the adapter's RewardUnavailable."""
    fake_openai.always = "500"
    wrapper = AsyncRewardWrapper(adapter.AReaLReward(url=served), max_workers=2, max_retries=1)
    got = run_wrapper(wrapper, rows(example_traces[:2]))
    assert all(isinstance(g, RewardUnavailable) for g in got), got
    assert "no reward" in str(got[0])


def test_a_server_too_slow_for_the_timeout_is_refused_in_one_line(
    probed, any_judge_server, example_traces, monkeypatch
):
    """A judge of 1 s a request against an AReaL timeout of 2 s: at the start (a probe rollout),
    and at the first call in a worker once the server's /metrics has measured that pace, one
    line naming AsyncRewardWrapper's timeout_seconds to set, with the value the pace needs; a
    check within that timeout passes."""
    monkeypatch.setattr(any_judge_server, "latency", 1.0)
    slow = adapter.AReaLReward(url=probed, areal_timeout=2.0)
    with pytest.raises(adapter.ServerTooSlow) as refused:
        slow.check_pace()
    line = str(refused.value)
    assert "\n" not in line and "AsyncRewardWrapper(reward_fn, timeout_seconds=" in line
    n = int(line.split("timeout_seconds=")[1].split(")")[0])
    assert n == adapter.timeout_needed(float(line.split("about ")[1].split(" s")[0]), 2.0) > 3
    wrapper = AsyncRewardWrapper(slow, timeout_seconds=2.0, max_retries=0)
    (got,) = run_wrapper(wrapper, rows(example_traces[:1]))
    assert isinstance(got, adapter.ServerTooSlow) and "/metrics" in str(got), got
    assert adapter.AReaLReward(url=probed, areal_timeout=float(n)).check_pace() is not None


def test_a_slow_check_raises_before_areals_timeout(served, fake_openai, example_traces):
    """A judge slower than AReaL's (small) timeout: the server is sent the adapter's shorter
    deadline, answers 503, and the function raises before AReaL would time it out into 0."""
    fake_openai.latency = 3.0
    late = adapter.AReaLReward(url=served, areal_timeout=2.0, refuse_slow=False)
    wrapper = AsyncRewardWrapper(late, timeout_seconds=2.0, max_retries=0)
    started = time.monotonic()
    (got,) = run_wrapper(wrapper, rows(example_traces[:1]))
    assert isinstance(got, RewardUnavailable), got  # AReaL's timeout would have given 0
    assert time.monotonic() - started < 2.0


def test_replicas_that_never_answer_give_an_error_not_areals_zero(example_traces):
    """Two replicas that take the request and never answer: each is waited on in turn, past
    the adapter's budget; its own deadline raises CheckTooSlow (not a TimeoutError, which AReaL
    turns into 0) before AReaL's timeout."""
    holes = [socket.create_server(("127.0.0.1", 0), backlog=16) for _ in range(2)]
    try:
        urls = ",".join(f"http://127.0.0.1:{h.getsockname()[1]}" for h in holes)
        wrapper = AsyncRewardWrapper(
            adapter.AReaLReward(url=urls, areal_timeout=4.0), timeout_seconds=4.0, max_retries=0
        )
        (got,) = run_wrapper(wrapper, rows(example_traces[:1]))
    finally:
        for h in holes:
            h.close()
    assert isinstance(got, adapter.CheckTooSlow) and not isinstance(got, TimeoutError), got


# ------------------------------------------------------------------ AReaL's RLVRWorkflow
@pytest.fixture(scope="module")
def tokenizer():
    from tests.fixtures.models import qwen_tokenizer

    return qwen_tokenizer()


class ScriptedEngine:
    """AReaL's inference engine as RLVRWorkflow uses it (`agenerate`): each prompt's
    completion is the example trace's response for its question."""

    def __init__(self, tokenizer, by_question: dict[str, str]) -> None:
        self.tokenizer, self.by_question = tokenizer, by_question

    async def agenerate(self, req):
        from areal.api.io_struct import ModelResponse

        prompt = self.tokenizer.decode(req.input_ids)
        question = prompt.split("Question: ", 1)[1].split("<|im_end|>", 1)[0]
        ids = self.tokenizer(self.by_question[question], add_special_tokens=False)["input_ids"]
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=ids,
            output_logprobs=[0.0] * len(ids),
            output_versions=[0] * len(ids),
            tokenizer=self.tokenizer,
        )


def prompt_ids(messages, tokenizer, enable_thinking):
    return tokenizer(chat_prompt(messages[-1]["content"]), add_special_tokens=False)["input_ids"]


def episodes(workflow, tokenizer, traces) -> list:
    engine = ScriptedEngine(tokenizer, {t.question: t.response for t in traces})
    data = [
        {"messages": [{"role": "user", "content": t.question}], "golden_answers": t.golden_answers}
        for t in traces
    ]

    async def main():
        calls = [workflow.arun_episode(engine, d) for d in data]
        return await asyncio.gather(*calls, return_exceptions=True)

    return asyncio.run(main())


def rollout_stats() -> dict[str, float]:
    from areal.utils import stats_tracker

    return stats_tracker.get("rollout").export()


def test_areal_rlvr_workflows_reward_each_episode_and_log_its_labels(
    probed, example_traces, tokenizer, monkeypatch
):
    """AReaL's own RLVRWorkflow over the function by name, and StepGapRLVRWorkflow (its pace
    checked at the start with a probe rollout, its logs in AReaL's rollout stats): each
    episode's `rewards` is `StepGapReward.score` of the decoded completion, as AReaL stores it
    (float32)."""
    import torch
    from areal.api.cli_args import GenerationHyperparameters
    from areal.utils.dynamic_import import import_from_string
    from areal.workflow.rlvr import RLVRWorkflow

    # as AReaL's trainer resolves `workflow="stepgap.serving.areal.StepGapRLVRWorkflow"`
    StepGapRLVRWorkflow = import_from_string("stepgap.serving.areal.StepGapRLVRWorkflow")

    texts = [
        tokenizer.decode(tokenizer(t.response, add_special_tokens=False)["input_ids"])
        for t in example_traces
    ]
    results = served_results(probed, texts, example_traces)
    expected = torch.tensor([r["reward"] for r in results], dtype=torch.float32)
    monkeypatch.setenv("STEPGAP_REWARD_URL", probed)
    gconfig = GenerationHyperparameters(max_new_tokens=64)
    rollout_stats()  # start from empty stats
    for workflow in (
        RLVRWorkflow(
            "stepgap.serving.areal.reward_fn", gconfig, tokenizer, get_input_ids_fn=prompt_ids
        ),
        StepGapRLVRWorkflow(  # as AReaL calls it with the trainer's workflow_kwargs
            reward_fn=adapter.AReaLReward(url=probed),
            gconfig=gconfig,
            tokenizer=tokenizer,
            get_input_ids_fn=prompt_ids,
            reward_timeout=15,
        ),
    ):
        got = episodes(workflow, tokenizer, example_traces)
        assert torch.equal(torch.cat([g["rewards"] for g in got]), expected), got
    stats = rollout_stats()
    assert stats["rollout/stepgap/em"] == pytest.approx(
        sum(r["em"] for r in results) / len(results)
    )
    assert stats["rollout/stepgap/no_reward"] == 0.0
    assert {"rollout/stepgap/rate_IE", "rollout/stepgap/repair_rate"} <= set(stats)


def test_areal_workflow_drops_a_rollout_whose_check_failed(
    served, fake_openai, example_traces, tokenizer
):
    """Judge down: the episode raises (AReaL's executor then drops the rollout) and
    `stepgap/no_reward` is counted; no reward of 0 is stored."""
    from areal.api.cli_args import GenerationHyperparameters

    from stepgap.serving.areal import AReaLReward, StepGapRLVRWorkflow

    workflow = StepGapRLVRWorkflow(
        AReaLReward(url=served),
        GenerationHyperparameters(max_new_tokens=64),
        tokenizer,
        get_input_ids_fn=prompt_ids,
        check_pace_at_start=False,
    )
    workflow.async_reward_fn.max_retries = 0
    fake_openai.always = "500"
    rollout_stats()
    (got,) = episodes(workflow, tokenizer, example_traces[:1])
    assert isinstance(got, RewardUnavailable), got
    assert rollout_stats()["rollout/stepgap/no_reward"] == 1.0


def test_the_example_scores_a_jsonl_through_areals_wrapper(probed, example_traces):
    """examples/areal_reward.py against a live `stepgap serve`: its pace check passes, and each
    row's printed reward is `StepGapReward.score`'s."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "areal_reward.py"
    out = subprocess.run(
        # AReaL's 60 s, not its 15: on a loaded machine the check itself may take longer, and
        # this test is about the rewards (the timeouts have tests of their own)
        [sys.executable, str(example), "--reward-url", probed, "--limit", "2", "--timeout", "60"],
        capture_output=True, text=True, timeout=240, check=True,
    )  # fmt: skip
    # AReaL logs to stdout too: the example's lines are the JSON ones
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    traces = example_traces[:2]
    expected = served_results(probed, [t.response for t in traces], traces)
    assert [line["id"] for line in lines[:2]] == [t.id for t in traces]
    assert (
        max(abs(line["reward"] - r["reward"]) for line, r in zip(lines[:2], expected, strict=True))
        <= 1e-9
    )
    assert lines[2]["rewarded"] == 2 and "stepgap/repair_rate" in lines[2]


def test_a_checker_in_areals_process_is_refused_on_transformers_5_3(
    tmp_path, fake_openai, monkeypatch
):
    """AReaL 1.0.4 caps transformers at 5.3.0, whose DeBERTa tokenizer loads without [CLS] and
    [SEP]: a reward config (the NLI in AReaL's process) is refused in one line naming the
    server path."""
    import json
    from importlib.metadata import version

    from packaging.version import Version

    from stepgap.serving import process_reward

    config = tmp_path / "reward.json"
    config.write_text(
        json.dumps(
            {
                "judge": "openai:gpt-4.1-mini",
                "base_url": fake_openai.base_url,
                "nli": str(tmp_path / "nli"),
            }
        )  # fmt: skip
    )
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    process_reward.reset()
    try:
        if Version(version("transformers")) >= Version("5.4"):
            pytest.skip("this venv's transformers reads DeBERTa's tokenizer right")
        with pytest.raises(RuntimeError, match=r"transformers>=5\.4 .*STEPGAP_REWARD_URL") as e:
            adapter.AReaLReward(config=str(config)).reward()
        assert "\n" not in str(e.value)
    finally:
        process_reward.reset()


def test_a_call_left_waiting_in_areals_pool_raises_instead_of_its_zero(
    served, fake_openai, example_traces
):
    """One reward process, four rollouts at once, checks of about 1 s against a timeout of
    4 s (room for the first on a loaded machine): the last calls wait in AReaL's pool past the timeout without the reward function
    ever starting. AReaL's own wrapper gives them 0; StepGapRewardWrapper raises instead."""
    fake_openai.latency = 1.0
    reward = adapter.AReaLReward(url=served, areal_timeout=4.0, refuse_slow=False)
    items = rows(example_traces[:1]) * 4
    plain = run_wrapper(AsyncRewardWrapper(reward, 4.0, max_workers=1, max_retries=0), items)
    assert 0 in plain, plain  # AReaL's own: a made-up reward for a call that never ran
    AsyncRewardWrapper._atexit_shutdown_all()
    ours = adapter.StepGapRewardWrapper(reward, 4.0, max_workers=1, max_retries=0)
    got = run_wrapper(ours, items)
    assert isinstance(got[0], adapter.StepGapScore), got
    assert all(isinstance(g, adapter.StepGapScore | adapter.CheckTooSlow) for g in got), got
    assert any(isinstance(g, adapter.CheckTooSlow) for g in got), got
