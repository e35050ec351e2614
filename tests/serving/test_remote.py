"""`RemoteChecker` over several `stepgap serve` replicas (processes): balanced, with failover
when one is killed mid-run, 503s honoured; no reward is ever lost."""

from __future__ import annotations

import signal
import threading

import httpx
import pytest

from stepgap.serving import StepGapReward
from stepgap.serving.remote import RemoteChecker, parse_urls
from tests.fixtures.live_server import ServeProcess

pytestmark = pytest.mark.timeout(300)


def _checked(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    line = next(x for x in metrics.splitlines() if x.startswith("stepgap_traces_checked_total"))
    return float(line.split()[-1])


@pytest.mark.slow
def test_three_replicas_one_killed_mid_run_every_reward_returned(
    fake_openai, examples_dir, example_traces, expected_rewards, tmp_path
):
    servers = [ServeProcess(fake_openai, examples_dir, tmp_path / f"s{i}.log") for i in range(3)]
    for s in servers:
        s.__enter__()
    try:
        checker = RemoteChecker([s.url for s in servers], retries=3)
        reward = StepGapReward(checker)
        responses = [t.response for t in example_traces]
        questions = [t.question for t in example_traces]
        golden = [t.golden_answers for t in example_traces]
        expected = [expected_rewards[t.id] for t in example_traces]
        got = []
        for round_ in range(8):
            if round_ == 3:  # a node dies between two batches, with no goodbye
                servers[1].proc.send_signal(signal.SIGKILL)
                servers[1].proc.wait()
            got.append([r.reward for r in reward.score(responses, questions, golden)])
        assert all(g == pytest.approx(expected) for g in got)  # every reward, exact
        assert not reward.failures  # no step lost its bracket: the parts went elsewhere
        assert checker.stats["failovers"] >= 1 and checker.stats["failed"] == 0
        alive = [_checked(s.url) for s in (servers[0], servers[2])]
        assert all(n >= 10 for n in alive)  # both surviving replicas took a share
        assert sum(alive) >= 8 * len(example_traces) - 3 * len(example_traces)
        # every replica gone: the results still come back, with no reward and why (never EM
        # alone passed off as the reward), the failures counted
        for s in (servers[0], servers[2]):
            s.proc.send_signal(signal.SIGKILL)
            s.proc.wait()
        orphan = RemoteChecker([s.url for s in servers], retries=1)
        results = StepGapReward(orphan).score(responses, questions, golden)
        assert all(r.reward is None for r in results)
        assert all("no stepgap replica answered" in r.unavailable for r in results)
        assert sum(r.failed_checks for r in results) == sum(len(t.steps) for t in example_traces)
        assert orphan.stats["failed"] >= 1
    finally:
        for s in servers:
            if s.proc.poll() is None:
                s.__exit__()
            else:
                s.log.close()


def test_a_busy_replica_is_skipped_and_503_retry_after_honoured(
    reward, example_traces, expected_rewards
):
    """One replica answers 503 (queue full): its part goes to the other at once; when both are
    busy, the client waits for Retry-After instead of failing."""
    from stepgap.serving.server import create_app
    from tests.fixtures.live_server import LiveServer

    busy = create_app(reward, max_queue=0)  # every request over capacity: 503, Retry-After: 1
    free = create_app(reward)
    with LiveServer(busy) as busy_url, LiveServer(free) as free_url:
        checker = RemoteChecker([busy_url, free_url], retries=2)
        traces = example_traces[:4]
        verdicts = checker.check(traces)
        assert len(verdicts) == 4 and all(
            len(v) == len(t.steps) for v, t in zip(verdicts, traces, strict=True)
        )
        assert checker.stats["busy_waits"] == 0  # the free replica took the busy one's part
        waits: list[float] = []  # the client's clock: sleeps are recorded, its time moves
        clock = [1000.0]
        only_busy = RemoteChecker(
            [busy_url], retries=1, now=lambda: clock[0],
            sleep=lambda s: (waits.append(s), clock.__setitem__(0, clock[0] + s)),
        )  # fmt: skip
        with pytest.raises(RuntimeError, match="no stepgap replica answered"):
            only_busy.check(traces[:1])
        assert waits == [1.0]  # it waited the Retry-After, once, before giving up
        assert only_busy.stats["busy_waits"] == 1


def test_urls_parse_and_each_process_has_its_own_client():
    assert parse_urls("http://a:1/, http://b:2") == ["http://a:1", "http://b:2"]
    with pytest.raises(ValueError):
        parse_urls(" , ")
    checker = RemoteChecker("http://127.0.0.1:9")
    first = checker.client
    assert checker.client is first
    box = []
    worker = threading.Thread(target=lambda: box.append(checker.client))
    worker.start()
    worker.join()
    assert box[0] is first  # threads share it; a forked process would get its own (pid check)
    checker._pid = -1  # as after a fork
    assert checker.client is not first
