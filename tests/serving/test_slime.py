"""slime's reward contract: its `remote_rm` payload on `stepgap serve`, and `rm(args, sample)`.

slime is not on the package index, so its client is written here as its `remote_rm` is
(slime/rollout/rm_hub/__init__.py): aiohttp, a total timeout a request (120 s there), any non-2xx
answer raised and retried, 10 tries with backoff, then the error goes up. The rewards must be
those of the example traces' stored verdicts; a sample whose check failed, or that cannot be
answered within slime's wait, must get an answer slime retries, never a number.
"""

from __future__ import annotations

import asyncio
import re
import time
from types import SimpleNamespace

import httpx
import pytest

from stepgap.serving import StepGapReward, process_reward, slime
from stepgap.serving.reward_function import RewardUnavailable
from stepgap.serving.server import create_app
from tests.fixtures.live_server import LiveServer
from tests.serving.conftest import chat_prompt
from tests.serving.test_server import FailsOneQuestion

aiohttp = pytest.importorskip("aiohttp", reason="slime's client is aiohttp's")
pytestmark = pytest.mark.timeout(180)


async def slime_remote_rm(url: str, payload: dict, total: float = 120.0, tries: int = 10):
    """slime's `remote_rm`, its waits between tries shortened (0.01 s, not 1, 2, 4, ... 30)."""
    timeout = aiohttp.ClientTimeout(total=total)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for attempt in range(tries):
            try:
                async with session.post(url, json=payload) as resp:
                    resp.raise_for_status()
                    return await resp.json()
            except Exception:
                if attempt + 1 >= tries:
                    raise
                await asyncio.sleep(0.01)


def payload(t, label_form: str = "reward_model") -> dict:
    labels = {
        "reward_model": {"ground_truth": {"target": list(t.golden_answers)}},
        "list": list(t.golden_answers),
        "string": t.golden_answers[0],
    }
    return {"prompt": chat_prompt(t.question), "response": t.response, "label": labels[label_form]}


def test_slimes_remote_rm_payload_gets_the_typed_reward(served, example_traces, expected_rewards):
    """Each label form slime's data may hold (Search-R1's reward_model column, a list, a
    string) gives the reward of the stored verdicts, a JSON number, as slime reads it."""
    for t, form in zip(example_traces, ["reward_model", "list", "string"] * 9, strict=False):
        if form == "string" and len(t.golden_answers) > 1:
            form = "list"
        got = asyncio.run(slime_remote_rm(f"{served}/remote_rm", payload(t, form)))
        assert isinstance(got, float) and got == pytest.approx(expected_rewards[t.id], abs=1e-9)
    chat = [{"role": "user", "content": f"Question: {example_traces[0].question}"}]
    body = {**payload(example_traces[0]), "prompt": chat}  # a prompt kept as chat messages
    got = httpx.post(f"{served}/remote_rm", json=body, timeout=60).json()
    assert got == pytest.approx(expected_rewards[example_traces[0].id], abs=1e-9)
    no_label = httpx.post(f"{served}/remote_rm", json={**body, "label": None}, timeout=60)
    assert no_label.status_code == 422 and "--label-key" in no_label.text
    # slime's logs of the typed reward: the server's steps by label and its repairs
    metrics = httpx.get(f"{served}/metrics").text
    by_label = dict(re.findall(r'^stepgap_steps_total\{label="(\w+)"\} (\S+)', metrics, re.M))
    steps = sum(len(t.steps) for t in example_traces) + len(example_traces[0].steps)
    assert sum(float(v) for v in by_label.values()) == steps and "failed" not in by_label
    assert float(by_label["CC"]) > 0 and re.search(
        r"^stepgap_repair_chances_total \S+", metrics, re.M
    )


def test_a_failed_check_is_retried_by_slime_and_never_a_number(reward, example_traces):
    """A sample whose every check fails is answered 503 naming why; slime's client retries it
    all its tries and then raises: no number, no 0, ever reaches slime."""
    t = example_traces[1]
    app = create_app(StepGapReward(FailsOneQuestion(reward.checker, t.question)), max_wait_ms=1)
    with LiveServer(app) as url:
        r = httpx.post(f"{url}/remote_rm", json=payload(t), timeout=60)
        n = len(t.steps)
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert f"{n} of {n} step check(s) failed (first: judge down)" in r.json()["detail"]
        with pytest.raises(aiohttp.ClientResponseError) as raised:
            asyncio.run(slime_remote_rm(f"{url}/remote_rm", payload(t), tries=3))
        assert raised.value.status == 503
        metrics = httpx.get(f"{url}/metrics").text
        assert 'stepgap_rejected_total{reason="no_reward"} 4.0' in metrics
        assert f'stepgap_steps_total{{label="failed"}} {4.0 * n}' in metrics


def test_a_sample_that_cannot_be_checked_in_slimes_wait_is_answered_503_before_it(
    fake_openai, examples_dir, example_traces, example_prompts, monkeypatch
):
    """slime sends no deadline: the route's own is slime's wait (120 s; 1.5 s here), not the
    server's --client-timeout (180 s), so a judge that holds its answers gets the sample a 503
    before slime's client gives up, and the retry finds the check the server kept going."""
    from stepgap.teacher import Checker, ReplayNLI, build_judge

    monkeypatch.setattr("stepgap.serving.routes.SLIME_SECONDS", 1.5)
    t = example_traces[0]
    for step in t.steps:
        fake_openai.faults[example_prompts[(t.id, step.index)]] = ["gated"]
    judge = build_judge("openai:gpt-4.1-mini", base_url=fake_openai.base_url, max_retries=0,
                        no_cache=True)  # fmt: skip
    reward = StepGapReward(Checker(judge, ReplayNLI.from_file(examples_dir / "nli_replay.jsonl")))
    with LiveServer(create_app(reward, max_wait_ms=1, client_timeout=180)) as url:
        started = time.monotonic()
        with pytest.raises(aiohttp.ClientResponseError) as raised:
            asyncio.run(slime_remote_rm(f"{url}/remote_rm", payload(t), total=20, tries=1))
        assert raised.value.status == 503 and time.monotonic() - started < 20
        fake_openai.gate.set()
        got = asyncio.run(slime_remote_rm(f"{url}/remote_rm", payload(t), total=60))
        assert isinstance(got, float)


def test_slimes_custom_rm_gives_the_typed_reward_one_or_a_group(
    reward, example_traces, expected_rewards
):
    """`--custom-rm-path stepgap.serving.slime.rm`: a Sample (prompt, response, label, metadata)
    or a group of them; the question from metadata where it is there. A failed check raises."""

    def sample(t, **extra):
        return SimpleNamespace(prompt=chat_prompt(t.question), response=t.response,
                               label=list(t.golden_answers), metadata={}, **extra)  # fmt: skip

    process_reward.reset()
    process_reward.configure(reward)
    try:
        args = SimpleNamespace(custom_rm_path="stepgap.serving.slime.rm")
        one = asyncio.run(slime.rm(args, sample(example_traces[0])))
        assert one == pytest.approx(expected_rewards[example_traces[0].id], abs=1e-9)
        group = asyncio.run(slime.rm(args, [sample(t) for t in example_traces[:3]]))
        assert group == pytest.approx([expected_rewards[t.id] for t in example_traces[:3]])
        asked = sample(example_traces[1])
        asked.prompt, asked.metadata = "no such line", {"question": example_traces[1].question}
        assert asyncio.run(slime.rm(args, asked)) == pytest.approx(
            expected_rewards[example_traces[1].id], abs=1e-9
        )
        process_reward.configure(
            StepGapReward(FailsOneQuestion(reward.checker, example_traces[2].question))
        )
        with pytest.raises(RewardUnavailable, match="step check"):
            asyncio.run(slime.rm(args, sample(example_traces[2])))
    finally:
        process_reward.reset()


def test_the_remote_rm_route_is_documented_with_a_valid_example(reward):
    from fastapi.testclient import TestClient

    from stepgap.serving import api

    app = create_app(StepGapReward(reward.checker, on_failed_check="zero"), max_wait_ms=5)
    with TestClient(app) as client:
        post = client.get("/openapi.json").json()["paths"]["/remote_rm"]["post"]
        ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("SlimeRequest")
        example = api.SlimeRequest.model_config["json_schema_extra"]["examples"][0]
        r = client.post("/remote_rm", json=example)
        assert r.status_code == 200 and isinstance(r.json(), float), r.text


def test_the_example_scores_rollouts_as_slimes_client_does(served, expected_rewards):
    """examples/slime_remote_rm.py against a live `stepgap serve`: each row's reward is the
    stored verdicts' reward; `--help` says what to start first."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "slime_remote_rm.py"
    shown = subprocess.run([sys.executable, str(example), "--help"], capture_output=True,
                           text=True, check=True).stdout  # fmt: skip
    assert "stepgap serve --judge" in shown and "--rm-url" in shown
    out = subprocess.run(
        [sys.executable, str(example), "--rm-url", f"{served}/remote_rm", "--limit", "3"],
        capture_output=True, text=True, check=True, timeout=240,
    ).stdout.splitlines()  # fmt: skip
    rows = [json.loads(line) for line in out]
    assert rows[-1] == {"rewarded": 3, "of": 3}
    for row in rows[:3]:
        assert row["reward"] == pytest.approx(expected_rewards[row["id"]], abs=1e-9), row
