"""`stepgap serve` under a bounded load on loopback, as its own process (RELIABILITY.md).

64 clients for 20 s below capacity: every request is answered with the in-process reward, some
clients hang up mid-request without poisoning the batches they were in, and the server's
resident memory stays flat. Above capacity (a small queue): only 200 or 503 with Retry-After,
and the server still answers afterwards.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.timeout(300)

CLIENTS = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


class ServeProcess:
    """`stepgap serve` with the openai judge against the fake server and replayed NLI."""

    def __init__(self, fake_openai, examples_dir: Path, log: Path, *extra: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable, "-m", "stepgap.cli", "serve", "--port", str(self.port),
            "--judge", "openai:gpt-4.1-mini", "--base-url", fake_openai.base_url, "--no-cache",
            "--max-retries", "0", "--nli", f"replay:{examples_dir / 'nli_replay.jsonl'}",
            "--max-batch", "16", "--max-wait-ms", "20", *extra,
        ]  # fmt: skip
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self) -> ServeProcess:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "stepgap serve exited at start"
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.2)
        raise TimeoutError("stepgap serve did not start")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


# 200 KB after the final answer: ignored by the segmenter (the reward is unchanged), but it makes
# every request big enough that keeping any part of finished requests would show in the RSS.
PADDING = "\n" + "trailing text after the answer " * 6_400


def _body(t) -> dict:
    return {
        "responses": [t.response + PADDING],
        "questions": [t.question],
        "golden_answers": [t.golden_answers],
    }


def _hammer(url: str, traces, expected, seconds: float, *, hang_up_every: int = 0):
    """CLIENTS threads posting /reward back to back; returns outcome counts and wrong answers."""
    outcomes: Counter[str] = Counter()
    wrong: list[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(k: int) -> None:
        with httpx.Client(timeout=60) as http:
            n = 0
            while time.monotonic() < stop:
                t = traces[(k + n) % len(traces)]
                n += 1
                if hang_up_every and k % 4 == 0 and n % hang_up_every == 0:
                    try:  # give up after 5 ms: the connection closes mid-request
                        httpx.post(f"{url}/reward", json=_body(t), timeout=0.005)
                        kind = "answered before hang-up"
                    except httpx.TimeoutException:
                        kind = "hung up"
                    with lock:
                        outcomes[kind] += 1
                    continue
                r = http.post(f"{url}/reward", json=_body(t))
                with lock:
                    outcomes[str(r.status_code)] += 1
                    if r.status_code == 200:
                        if r.json()["rewards"] != pytest.approx([expected[t.id]]):
                            wrong.append(t.id)
                    elif r.status_code == 503 and r.headers.get("Retry-After") != "1":
                        wrong.append("503 without Retry-After")
                if r.status_code == 503:
                    time.sleep(float(r.headers.get("Retry-After", "1")) / 10)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return outcomes, wrong


def test_64_clients_for_20_s_lose_nothing_and_memory_stays_flat(
    fake_openai, examples_dir, example_traces, expected_rewards, tmp_path
):
    with ServeProcess(fake_openai, examples_dir, tmp_path / "serve.log") as server:
        _hammer(server.url, example_traces, expected_rewards, 3)  # warm-up: imports, pools, caches
        rss_before = _rss_mib(server.proc.pid)
        outcomes, wrong = _hammer(server.url, example_traces, expected_rewards, 20, hang_up_every=5)
        time.sleep(1)  # let the batches of hung-up clients finish
        rss_after = _rss_mib(server.proc.pid)
        health = httpx.get(f"{server.url}/health").json()
        metrics = httpx.get(f"{server.url}/metrics").text
        # A request after the load is answered exactly.
        t = example_traces[0]
        last = httpx.post(f"{server.url}/reward", json=_body(t), timeout=60).json()
    print(f"outcomes {dict(outcomes)}; RSS {rss_before:.1f} -> {rss_after:.1f} MiB")
    assert not wrong
    assert set(outcomes) <= {"200", "hung up", "answered before hang-up"}, outcomes
    assert outcomes["200"] > 200 and outcomes["hung up"] >= 5  # real load, real hang-ups
    assert health["status"] == "ok" and health["queued"] == 0
    # The hung-up clients' traces were dropped, not checked for nobody.
    gone = re.search(r'^stepgap_rejected_total\{reason="client_gone"\} (\S+)', metrics, re.M)
    assert gone and float(gone.group(1)) >= 1
    assert last["rewards"] == pytest.approx([expected_rewards[t.id]])
    # Keeping each finished request's body would add 200 KB x requests (over 40 MiB).
    assert rss_after - rss_before < 20, f"memory grew {rss_after - rss_before:.1f} MiB under load"
    log = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]


def test_above_capacity_only_503_with_retry_after_and_the_server_survives(
    fake_openai, examples_dir, example_traces, expected_rewards, tmp_path
):
    with ServeProcess(
        fake_openai, examples_dir, tmp_path / "serve.log", "--max-queue", "8"
    ) as server:
        outcomes, wrong = _hammer(server.url, example_traces, expected_rewards, 6)
        t = example_traces[1]
        after = httpx.post(f"{server.url}/reward", json=_body(t), timeout=60)
        alive = server.proc.poll() is None
    print(f"outcomes {dict(outcomes)}")
    assert not wrong
    assert set(outcomes) == {"200", "503"}, outcomes
    assert alive and after.status_code == 200
    assert after.json()["rewards"] == pytest.approx([expected_rewards[t.id]])
