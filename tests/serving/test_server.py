"""`stepgap serve` on loopback: 32 concurrent clients, micro-batching, 503, 413, OpenRLHF."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn

from stepgap.serving.remote import RemoteChecker
from stepgap.serving.server import create_app

pytestmark = pytest.mark.timeout(180)


class LiveServer:
    def __init__(self, app) -> None:
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "server did not shut down"


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
        assert (
            float(re.search(r"^stepgap_traces_checked_total (\S+)", metrics, re.M).group(1)) == 32
        )
        assert httpx.get(f"{url}/health").json()["status"] == "ok"


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
