"""The reward service on Ray Serve (`stepgap serve --ray`), on the local two-node cluster: two
replicas, one per node, answer as the in-process reward does; OpenRLHF's own client gets its
rewards from the Serve URL; a replica killed mid-run loses no reward."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from stepgap.serving import StepGapReward
from stepgap.serving.remote import RemoteChecker
from stepgap.teacher import CheckerConfig
from tests.fixtures.live_server import _free_port
from tests.fixtures.openai_server import FakeOpenAI

# heavy: Ray Serve on a two-node local cluster (`-m "not slow"` skips it locally; CI runs it)
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def judge_server(example_answers):
    server = FakeOpenAI(answers=dict(example_answers), latency=0.05).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def serve_url(ray_cluster, judge_server, examples_dir, tmp_path_factory):
    """Two replicas, each holding one `node_slot` (one per node), behind Serve's proxy."""
    from ray import serve

    from stepgap.serving.ray_serve import build_app

    config = CheckerConfig(
        judge="openai:gpt-4.1-mini",
        base_url=judge_server.base_url,
        no_cache=True,
        max_retries=0,
        nli=f"replay:{examples_dir / 'nli_replay.jsonl'}",
    )
    shipped = yaml.safe_load((REPO / "serving" / "ray_serve.yaml").read_text())
    (entry,) = shipped["applications"]
    assert entry["import_path"] == "stepgap.serving.ray_serve:build_app"
    reward_json = tmp_path_factory.mktemp("serve") / "reward.json"
    reward_json.write_text(json.dumps(config.changed()))
    args = {**entry["args"], "config": str(reward_json),  # the shipped args, sized to this cluster
            "ray_actor_options": {"num_cpus": 0.5, "resources": {"node_slot": 1}}}  # fmt: skip
    port = _free_port()
    # Serve waits a fixed 60 s for its HTTP proxies, one per node; at load 8+ two take longer
    # on 2 cores (Ray's own constant, read where serve.start uses it)
    import ray.serve._private.api as serve_api

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serve_api, "HTTP_PROXY_TIMEOUT", 600)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(args), name="stepgap", route_prefix="/")
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()


def _replicas() -> list[str]:
    import ray

    return sorted(
        a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::stepgap#stepgap")
    )  # fmt: skip


def test_two_replicas_on_two_nodes_give_the_in_process_rewards(
    serve_url, example_traces, expected_rewards
):
    import ray

    assert len(_replicas()) == 2
    assert ray.available_resources().get("node_slot", 0) == 0  # one replica on each node
    body = {
        "responses": [t.response for t in example_traces],
        "questions": [t.question for t in example_traces],
        "golden_answers": [t.golden_answers for t in example_traces],
    }
    got = httpx.post(f"{serve_url}/reward", json=body, timeout=120).json()
    assert got["rewards"] == pytest.approx([expected_rewards[t.id] for t in example_traces])
    checked = httpx.post(
        f"{serve_url}/check", json={"traces": [example_traces[0].model_dump()]}, timeout=120
    ).json()
    steps = [s.index for s in example_traces[0].steps]
    assert [v["step"] for v in checked["verdicts"][0]] == steps and len(steps) > 1
    assert httpx.get(f"{serve_url}/health").json()["failed_checks"] == 0
    bad = httpx.post(f"{serve_url}/reward", json={**body, "questions": body["questions"][:1]})
    assert bad.status_code == 422 and "one of each per rollout" in bad.text
    t = example_traces[0]  # slime's remote_rm payload: one sample, a number back
    slime = {"prompt": f"Question: {t.question}\n", "response": t.response,
             "label": {"ground_truth": {"target": t.golden_answers}}}  # fmt: skip
    got = httpx.post(f"{serve_url}/remote_rm", json=slime, timeout=120).json()
    assert got == pytest.approx(expected_rewards[t.id], abs=1e-9)


def test_openrlhfs_client_gets_its_rewards_from_the_serve_url(
    serve_url, example_traces, expected_rewards
):
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    prompts = [
        f"<|im_start|>user\nQuestion: {t.question}<|im_end|>\n<|im_start|>assistant\n"
        for t in example_traces
    ]
    queries = [p + t.response for p, t in zip(prompts, example_traces, strict=True)]
    labels = [t.golden_answers for t in example_traces]
    client = SingleTurnAgentExecutor([f"{serve_url}/get_reward"])
    answers = asyncio.run(client._fetch_rewards_via_http(queries, prompts, labels))
    rewards = [r for a in answers for r in a["rewards"]]
    assert rewards == pytest.approx([expected_rewards[t.id] for t in example_traces])


def test_a_replica_killed_mid_run_loses_no_reward(serve_url, example_traces, expected_rewards):
    """Four clients keep both replicas busy; one replica is killed (`ray.kill`) while they do.
    Every call returns a reward for every rollout; a reward whose checks were lost with the
    replica falls to EM alone and is counted as failed, never raised."""
    import ray

    reward = StepGapReward(RemoteChecker(serve_url, timeout=60, retries=8))
    rounds, clients, results, errors = 5, 4, [], []

    def client() -> None:
        for _ in range(rounds):
            try:
                results.append(reward.score_traces(example_traces))
            except Exception as exc:  # the reward must never raise
                errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for th in threads:
        th.start()
    while len(results) < 2:
        time.sleep(0.02)
    victim = _replicas()[0]
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=False)
    for th in threads:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in threads) and errors == []
    assert len(results) == rounds * clients
    assert all(len(r) == len(example_traces) for r in results)
    expected = [expected_rewards[t.id] for t in example_traces]
    lost = sum(
        r.reward != pytest.approx(e) for rs in results for r, e in zip(rs, expected, strict=True)
    )
    assert lost <= reward.failures["failed_checks"]
    deadline = time.monotonic() + 60  # Serve replaces the killed replica
    while (len(_replicas()) < 2 or victim in _replicas()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(_replicas()) == 2


def test_stepgap_serve_ray_deploys_the_app_from_the_command_line(
    ray_cluster, serve_url, judge_server, examples_dir, example_traces
):
    """`stepgap serve --ray ADDRESS`: a driver of its own deploys the app (here replacing the
    module's, on Serve's port), with the checker flags of `stepgap serve`."""
    from stepgap.teacher import Checker, ReplayJudge, ReplayNLI

    port = int(serve_url.rsplit(":", 1)[1])
    cmd = [sys.executable, "-m", "stepgap.cli", "serve", "--ray", ray_cluster.address,
           "--port", str(port), "--judge", "openai:gpt-4.1-mini", "--base-url",
           judge_server.base_url, "--no-cache",
           "--nli", f"replay:{examples_dir / 'nli_replay.jsonl'}", "--variant", "binary_gap",
           "--ray-replicas", "1", "--ray-cpus", "0.5"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{serve_url}/health").json().get("variant") == "binary_gap":
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.5)
        body = {
            "responses": [t.response for t in example_traces],
            "questions": [t.question for t in example_traces],
            "golden_answers": [t.golden_answers for t in example_traces],
        }
        got = httpx.post(f"{serve_url}/reward", json=body, timeout=120).json()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    checker = Checker(
        ReplayJudge.from_file(examples_dir / "judge_replay.jsonl"),
        ReplayNLI.from_file(examples_dir / "nli_replay.jsonl"),
    )
    expected = StepGapReward(checker, "binary_gap").score_traces(example_traces)
    assert got["rewards"] == pytest.approx([r.reward for r in expected])
