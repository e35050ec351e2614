"""`stepgap serve` when the judge is down or stops, and when a client leaves: never a fake
reward (a rollout whose checks failed gets its trainer's own "no reward"), `/health` says
`degraded` while the judge fails, and a gone client's judge requests are closed at once."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from stepgap.serving import StepGapReward
from stepgap.serving.reward_function import RewardUnavailable
from stepgap.serving.server import create_app
from stepgap.teacher import Checker, ReplayNLI, build_judge
from tests.fixtures.live_server import LiveServer
from tests.serving.conftest import chat_prompt

pytestmark = pytest.mark.timeout(180)


def _reward(base_url: str, examples_dir, **options) -> StepGapReward:
    judge = build_judge("openai:gpt-4.1-mini", base_url=base_url, max_retries=0, no_cache=True)
    checker = Checker(judge, ReplayNLI.from_file(examples_dir / "nli_replay.jsonl"))
    return StepGapReward(checker, **options)


def _body(traces) -> dict:
    return {
        "responses": [t.response for t in traces],
        "questions": [t.question for t in traces],
        "golden_answers": [t.golden_answers for t in traces],
    }


def _openrlhf(traces) -> dict:
    prompts = [chat_prompt(t.question) for t in traces]
    return {
        "query": [p + t.response for p, t in zip(prompts, traces, strict=True)],
        "prompts": prompts,
        "labels": [t.golden_answers for t in traces],
    }


def test_a_dead_judge_gives_no_reward_anywhere(examples_dir, example_traces):
    """`--base-url` of nothing: the judge's first connection refused marks it down, and every
    route answers 503 with Retry-After (OpenRLHF's client then gives the rollout no reward, or
    tries again), `/health` is degraded and says why; never an exact-match-only number."""
    reward = _reward("http://127.0.0.1:9/v1", examples_dir)
    with LiveServer(create_app(reward, max_wait_ms=1)) as url:
        assert httpx.get(f"{url}/health").json()["status"] == "ok"  # nothing checked yet
        r = httpx.post(f"{url}/get_reward", json=_openrlhf(example_traces[:2]), timeout=60)
        assert r.status_code == 503 and "cannot be reached" in r.json()["detail"]
        assert r.headers["Retry-After"] == "1"
        r = httpx.post(f"{url}/reward", json=_body(example_traces[:2]), timeout=60)
        assert r.status_code == 503 and "cannot be reached" in r.json()["detail"]
        health = httpx.get(f"{url}/health").json()
        assert health["status"] == "degraded" and "cannot be reached" in health["judge_failure"]
        metrics = httpx.get(f"{url}/metrics").text
        assert 'stepgap_rejected_total{reason="judge_down"} 2.0' in metrics


def test_exact_match_alone_stays_an_explicit_choice(examples_dir, example_traces):
    reward = _reward("http://127.0.0.1:9/v1", examples_dir, on_failed_check="zero")
    with LiveServer(create_app(reward, max_wait_ms=1)) as url:
        r = httpx.post(f"{url}/get_reward", json=_openrlhf(example_traces[:1]), timeout=60)
        assert r.status_code == 200
        assert r.json()["rewards"] == [1.0]  # case 1 is answered right: EM alone
        assert httpx.get(f"{url}/health").json()["on_failed_check"] == "zero"


def test_the_trainers_own_no_reward(examples_dir, example_traces):
    """TRL gets None (its "no reward"), veRL's compute_score raises (veRL has none: its
    rate_limited manager logs it and scores 0, the others stop), OpenRLHF's in-process
    reward function raises (its executor then gives the rollout none)."""
    from stepgap.serving import openrlhf, process_reward, verl
    from stepgap.serving.trl import stepgap_reward_func

    reward = _reward("http://127.0.0.1:9/v1", examples_dir)
    t = example_traces[0]
    trl = stepgap_reward_func(reward)
    assert trl(prompts=[t.question], completions=[t.response], golden_answers=[t.golden_answers]) == [None]  # fmt: skip
    process_reward.configure(reward)
    try:
        with pytest.raises(RewardUnavailable, match="step check"):
            verl.compute_score("nq", t.response, t.golden_answers, {"question": t.question})
        with pytest.raises(RewardUnavailable):
            openrlhf.reward_func(**_openrlhf([t]) | {"queries": _openrlhf([t])["query"]})
    finally:
        process_reward.reset()


def test_a_judge_that_stops_mid_run_then_comes_back(
    fake_openai, examples_dir, example_traces, expected_rewards
):
    reward = _reward(fake_openai.base_url, examples_dir)
    with LiveServer(create_app(reward, max_wait_ms=1)) as url:
        first = httpx.post(f"{url}/reward", json=_body(example_traces[:1]), timeout=60).json()
        assert first["rewards"] == [pytest.approx(expected_rewards[example_traces[0].id])]
        fake_openai.always = "500"  # the engine fails every request from now on
        r = httpx.post(f"{url}/get_reward", json=_openrlhf(example_traces[1:2]), timeout=60)
        assert r.status_code == 503
        assert httpx.get(f"{url}/health").json()["status"] == "degraded"
        fake_openai.always = None  # back
        again = httpx.post(f"{url}/reward", json=_body(example_traces[1:2]), timeout=60).json()
        assert again["rewards"] == [pytest.approx(expected_rewards[example_traces[1].id])]
        assert httpx.get(f"{url}/health").json()["status"] == "ok"


def _post_raw(url: str, body: dict) -> socket.socket:
    """A POST whose connection the test can close mid-request, as a killed worker's is."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    client = socket.create_connection((host, int(port)))
    client.sendall(
        b"POST /reward HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return client


def test_a_gone_clients_judge_requests_are_closed_at_once(
    fake_openai, examples_dir, example_traces, example_prompts
):
    """Two clients whose rollouts share one checker call; one hangs up while the judge works
    and no time is kept for a retry (`keep_for_retry=0`): within a second the judge server
    sees that rollout's requests closed, not left to finish, while the other client's go on."""
    fake_openai.latency = 30.0
    reward = _reward(fake_openai.base_url, examples_dir)
    reward.checker.judge.working = True  # every step's request at once
    gone, stays = example_traces[1], example_traces[3]
    ours = {example_prompts[(gone.id, s.index)] for s in gone.steps}
    # the call starts once both traces are in (max_batch 2), however slow the machine
    app = create_app(reward, max_batch=2, max_wait_ms=10_000, keep_for_retry=0)
    with LiveServer(app) as url:
        leaving = _post_raw(url, _body([gone]))
        staying = _post_raw(url, _body([stays]))
        try:  # closed on a failure too: a server whose clients still wait cannot shut down
            deadline = time.monotonic() + 30
            while len(fake_openai.events) < len(gone.steps) + len(stays.steps):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert httpx.get(f"{url}/metrics").text.count("stepgap_batch_size_count 1.0") == 1
            left = time.monotonic()
            leaving.close()  # that rollout worker is gone
            while len(fake_openai.cancelled()) < len(gone.steps) and time.monotonic() < left + 5:
                time.sleep(0.01)
            closed = fake_openai.cancelled()
            assert {e.key for e in closed} == ours  # only the gone client's requests
            assert max(e.closed_at - left for e in closed) < 1.0
            metrics = httpx.get(f"{url}/metrics").text
            assert 'stepgap_traces_dropped_total{reason="client_gone"} 1.0' in metrics
        finally:
            leaving.close()
            staying.close()
