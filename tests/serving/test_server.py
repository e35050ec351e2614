"""`stepgap serve` on loopback: 32 concurrent clients, micro-batching, 503, 413, OpenRLHF."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from stepgap.serving import StepGapReward
from stepgap.serving.remote import RemoteChecker
from stepgap.serving.reward_function import failed_verdicts
from stepgap.serving.server import create_app
from stepgap.teacher.checker import StepChecker
from tests.fixtures.live_server import LiveServer

pytestmark = pytest.mark.timeout(180)


def _prompt(q: str) -> str:
    return (
        f"<|im_start|>user\nAnswer with search. Question: {q}\n<|im_end|>\n<|im_start|>assistant\n"
    )


def test_32_concurrent_openrlhf_clients_are_batched_and_match_in_process(
    reward, example_traces, expected_rewards
):
    app = create_app(reward, max_batch=16, max_wait_ms=50)
    with LiveServer(app) as url:

        def client(i: int) -> tuple[str, dict]:
            t = example_traces[i % len(example_traces)]
            body = {
                "query": [_prompt(t.question) + t.response],
                "prompts": [_prompt(t.question)],
                "labels": [t.golden_answers],
            }
            r = httpx.post(f"{url}/get_reward", json=body, timeout=120)
            r.raise_for_status()
            return t.id, r.json()

        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(client, range(32)))
        assert len(answers) == 32
        for trace_id, body in answers:
            assert body["rewards"] == pytest.approx([expected_rewards[trace_id]])
            assert body["scores"] == body["rewards"]
            assert {"em", "rate_CC", "rate_IE", "rate_MB"} <= set(body["extra_logs"])
        metrics = httpx.get(f"{url}/metrics").text
        count = float(re.search(r"^stepgap_batch_size_count (\S+)", metrics, re.M).group(1))
        singles = float(
            re.search(r'^stepgap_batch_size_bucket\{le="1.0"\} (\S+)', metrics, re.M).group(1)
        )
        assert count < 32 and singles < count  # some checker calls served several clients
        # 32 rollouts, 10 distinct ones: a copy that comes while its twin is checked shares it
        checked = float(re.search(r"^stepgap_traces_checked_total (\S+)", metrics, re.M).group(1))
        assert len(example_traces) <= checked <= 32
        assert httpx.get(f"{url}/health").json()["status"] == "ok"


class FailsOneQuestion(StepChecker):
    """A real checker, except that every check of the rollouts asking `question` fails."""

    def __init__(self, checker: StepChecker, question: str) -> None:
        self.checker, self.question = checker, question

    @property
    def provenance(self):
        return self.checker.provenance

    def check(self, traces):
        out = self.checker.check(traces)
        return [
            failed_verdicts(t.id, t.steps, "judge down") if t.question == self.question else vs
            for t, vs in zip(traces, out, strict=True)
        ]


def test_a_batch_with_an_unrewardable_rollout_is_refused_naming_it(
    reward, example_traces, expected_rewards
):
    """OpenRLHF's answer has no per-rollout "no reward", so /get_reward refuses the batch, its
    JSON detail naming the rollout (index, trace id, why) and giving the others' rewards, never
    a number for it; /reward answers the same batch with null for it alone."""
    traces = example_traces[:3]
    checker = FailsOneQuestion(reward.checker, traces[1].question)
    with LiveServer(create_app(StepGapReward(checker), max_wait_ms=1)) as url:
        body = {
            "query": [_prompt(t.question) + t.response for t in traces],
            "prompts": [_prompt(t.question) for t in traces],
            "labels": [t.golden_answers for t in traces],
        }
        r = httpx.post(f"{url}/get_reward", json=body, timeout=60)
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        detail = r.json()["detail"]
        n = len(traces[1].steps)
        why = f"{n} of {n} step check(s) failed (first: judge down)"
        assert detail["no_reward"] == [{"index": 1, "trace_id": "get_reward-1", "reason": why}]
        assert detail["rewards"][1] is None
        assert detail["rewards"][::2] == pytest.approx(
            [expected_rewards[t.id] for t in traces[::2]]
        )
        assert "no reward for 1 of 3 rollout(s) of the batch" in detail["message"]
        assert f"[1] get_reward-1: {why}" in detail["message"]
        answer = httpx.post(f"{url}/reward", json={
            "responses": [t.response for t in traces], "questions": [t.question for t in traces],
            "golden_answers": [t.golden_answers for t in traces]}, timeout=60).json()  # fmt: skip
        assert answer["rewards"] == detail["rewards"]
        assert answer["results"][1]["reward"] is None and answer["results"][1]["unavailable"] == why
        assert 'stepgap_rejected_total{reason="no_reward"} 1.0' in httpx.get(f"{url}/metrics").text


def test_check_route_and_remote_checker_equal_in_process(reward, example_traces):
    app = create_app(reward, max_batch=8, max_wait_ms=5)
    local = reward.checker.check(example_traces)
    with LiveServer(app) as url:
        remote = RemoteChecker(url).check(example_traces)
    assert [[(v.trace_id, v.step, v.label, v.path) for v in vs] for vs in remote] == [
        [(v.trace_id, v.step, v.label, v.path) for v in vs] for vs in local
    ]


def test_full_queue_answers_503_and_big_bodies_413(reward, example_traces):
    app = create_app(reward, max_queue=2, max_body_bytes=200_000)
    with LiveServer(app) as url:
        body = {"traces": [t.model_dump(mode="json") for t in example_traces[:3]]}
        r = httpx.post(f"{url}/check", json=body)
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        r = httpx.post(
            f"{url}/check", content=b"x" * 300_000, headers={"content-type": "application/json"}
        )
        assert r.status_code == 413
        r = httpx.post(
            f"{url}/get_reward", json={"query": ["a", "b"], "prompts": ["a"], "labels": ["x"]}
        )
        assert r.status_code == 422
        metrics = httpx.get(f"{url}/metrics").text
        assert 'stepgap_rejected_total{reason="queue_full"} 1.0' in metrics


def test_openapi_and_docs_document_every_route_and_the_examples_are_valid_requests(reward):
    """/docs and /openapi.json answer; every body is a named model with an example, and each
    example, posted as is, is accepted and answered in the documented shape."""
    from fastapi.testclient import TestClient

    from stepgap.serving import api

    # the examples are not the stored traces, whose judge and NLI answers the fakes hold: every
    # check fails, and scoring failed steps at 0 still answers each route in its own shape
    reward = StepGapReward(reward.checker, on_failed_check="zero")

    app = create_app(reward, max_batch=4, max_wait_ms=5)
    with TestClient(app) as client:
        for page in ("/docs", "/redoc"):  # pages that load nothing from another host
            html = client.get(page).text
            scripts = re.findall(r'(?:src|href)="([^"]+)"', html)
            assert scripts and all(s.startswith("/") for s in scripts), (page, scripts)
            for script in scripts:
                assert client.get(script).status_code == 200, script
        spec = client.get("/openapi.json").json()
        schemas = spec["components"]["schemas"]
        bodies = {
            "/check": (api.CheckRequest, api.CheckResponse),
            "/reward": (api.RewardRequest, api.RewardResponse),
            "/get_reward": (api.OpenRLHFRequest, api.OpenRLHFResponse),
        }
        for path, (request_model, response_model) in bodies.items():
            post = spec["paths"][path]["post"]
            ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert (
                ref.endswith(request_model.__name__) and schemas[request_model.__name__]["examples"]
            )
            out = post["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
            assert out.endswith(response_model.__name__)
            example = schemas[request_model.__name__]["examples"][0]
            r = client.post(path, json=example)
            assert r.status_code == 200, r.text
            response_model.model_validate(r.json())
        health = spec["paths"]["/health"]["get"]["responses"]["200"]["content"]
        assert health["application/json"]["schema"]["$ref"].endswith("HealthResponse")
        api.HealthResponse.model_validate(client.get("/health").json())
        assert "text/plain" in client.get("/metrics").headers["content-type"]
        # a malformed body names the field
        bad = client.post("/reward", json={"responses": [], "questions": [], "golden_answers": []})
        assert bad.status_code == 422 and "responses" in bad.text


def test_view_shows_the_last_checked_traces_and_forgets_older_ones(examples_dir, example_traces):
    """GET /view: the page of `stepgap view` for the last `view_keep` traces, newest first, with
    the rewards of the reward routes; the server holds no more than `view_keep` of them."""
    import json

    from stepgap.serving import StepGapReward
    from stepgap.teacher import Checker, ReplayJudge, ReplayNLI

    checker = Checker(
        ReplayJudge.from_file(examples_dir / "judge_replay.jsonl"),
        ReplayNLI.from_file(examples_dir / "nli_replay.jsonl"),
    )
    app = create_app(StepGapReward(checker), max_wait_ms=1, view_keep=3)

    def shown(url: str) -> dict:
        r = httpx.get(f"{url}/view")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        blob = re.search(r'<script type="application/json" id="stepgap-data">(.*?)</script>',
                         r.text, re.S).group(1)  # fmt: skip
        return json.loads(blob)

    with LiveServer(app) as url:
        assert shown(url)["traces"] == []
        raw = [t.model_dump(mode="json", exclude={"steps"}) for t in example_traces]
        for trace in raw[:5]:  # one request each: five traces for a memory of three
            httpx.post(f"{url}/check", json={"traces": [trace]}, timeout=60).raise_for_status()
        data = shown(url)
        assert [t["id"] for t in data["traces"]] == [f"#{i} {raw[i - 1]['id']}" for i in (5, 4, 3)]
        assert len(app.state.stepgap.recent) == 3  # the two oldest were dropped
        expected = {(v.trace_id, v.step): v.label for vs in checker.check(example_traces[2:5])
                    for v in vs}  # fmt: skip
        got = {(t["id"].split(" ", 1)[1], s["index"]): s["verdicts"][0]["label"]
               for t in data["traces"] for s in t["steps"]}  # fmt: skip
        assert got == expected
        assert data["summary"]["sources"] == {"served": [
            "judge replay:judge_replay.jsonl: replayed: stored answers, no model ran",
            "nli replay:nli_replay.jsonl: replayed: stored answers, no model ran",
        ]}  # fmt: skip
        case4 = example_traces[3]
        body = {"responses": [case4.response] * 10, "questions": [case4.question] * 10,
                "golden_answers": [case4.golden_answers] * 10}  # fmt: skip
        rewards = httpx.post(f"{url}/reward", json=body, timeout=60).json()["rewards"]
        data = shown(url)
        assert [t["id"] for t in data["traces"]] == ["#15 reward-9", "#14 reward-8", "#13 reward-7"]
        assert [t["reward"]["total"] for t in data["traces"]] == rewards[-3:]
        assert len(app.state.stepgap.recent) == 3
        metrics = httpx.get(f"{url}/metrics").text
        assert 'stepgap_requests_total{route="view"} 3.0' in metrics


def test_serve_refuses_a_replay_judge(examples_dir, capsys):
    from stepgap.cli import main

    assert main(["serve", f"--judge=replay:{examples_dir / 'judge_replay.jsonl'}",
                 f"--nli=replay:{examples_dir / 'nli_replay.jsonl'}"]) == 2  # fmt: skip
    assert "a replay judge answers by trace id" in capsys.readouterr().err


def test_trls_reward_function_through_stepgap_serve_gives_the_in_process_rewards(
    served, example_traces, expected_rewards
):
    """TRL's reward function over a `stepgap serve` URL (`RemoteChecker`): the rewards of the
    stored verdicts, as TRL passes its columns (prompts, completions, golden_answers)."""
    from stepgap.serving.trl import stepgap_reward_func

    func = stepgap_reward_func(StepGapReward(RemoteChecker(served)))
    got = func(
        prompts=[_prompt(t.question) for t in example_traces],
        completions=[[{"role": "assistant", "content": t.response}] for t in example_traces],
        golden_answers=[t.golden_answers for t in example_traces],
    )
    assert got == pytest.approx([expected_rewards[t.id] for t in example_traces], abs=1e-9)
