"""The `openai:` judge against a real HTTP server on 127.0.0.1 that injects every fault."""

from __future__ import annotations

import json

import pytest

from stepgap.teacher import Checker, ReplayJudge, ReplayNLI
from stepgap.teacher.judges import CostMeter, JudgeConfigError, build_judge

pytestmark = pytest.mark.timeout(120)


def _judge(server, tmp_path, **kw):
    options = dict(
        base_url=server.base_url, max_retries=2, timeout=1.0, concurrency=4, invalid_retries=2
    )
    options.update(kw)
    return build_judge("openai:gpt-4.1-mini", cache=str(tmp_path / "cache.sqlite"), **options)


def _run(judge, traces, examples_dir):
    nli = ReplayNLI.from_file(examples_dir / "nli_replay.jsonl")
    return [v for vs in Checker(judge, nli).check(traces) for v in vs]


@pytest.fixture
def replay_verdicts(example_traces, examples_dir):
    judge = ReplayJudge.from_file(examples_dir / "judge_replay.jsonl")
    return {(v.trace_id, v.step): v for v in _run(judge, example_traces, examples_dir)}


def test_labels_equal_replay_and_cost_and_confidences_are_counted(
    fake_openai, tmp_path, example_traces, examples_dir, replay_verdicts
):
    judge = _judge(fake_openai, tmp_path)
    verdicts = _run(judge, example_traces, examples_dir)
    assert len(verdicts) == len(replay_verdicts) == 28
    for v in verdicts:
        ref = replay_verdicts[(v.trace_id, v.step)]
        assert (v.label, v.path, v.error) == (ref.label, ref.path, None)
        # The server gives every token p=0.9: stage A has one decisive field, B and C two.
        assert v.judge_confidences == pytest.approx({"A": 0.9, "B": 0.81, "C": 0.81})
    m = judge.meter
    assert (m.calls, m.cache_hits, m.prompt_tokens, m.completion_tokens) == (28, 0, 28000, 2800)
    assert m.cost == pytest.approx(28 * (1000 * 0.40 + 100 * 1.60) / 1e6)
    # A second run is served from the cache: no request reaches the server, nothing is paid.
    sent = len(fake_openai.events)
    again = _judge(fake_openai, tmp_path)
    assert [v.label for v in _run(again, example_traces, examples_dir)] == [
        v.label for v in verdicts
    ]
    assert len(fake_openai.events) == sent
    assert (again.meter.calls, again.meter.cache_hits, again.meter.cost) == (0, 28, 0.0)


def test_the_answer_schema_is_built_once_per_judge_not_per_request(
    fake_openai, tmp_path, example_traces, examples_dir, monkeypatch
):
    """28 requests, one schema build: rebuilding it per request was a quarter of the labeling
    client's CPU at concurrency 32."""
    import stepgap.teacher.judges.openai_api as api

    judge = _judge(fake_openai, tmp_path)
    built = []
    real = api.judge_json_schema
    monkeypatch.setattr(api, "judge_json_schema", lambda: built.append(1) or real())
    assert len(_run(judge, example_traces, examples_dir)) == 28
    assert len(built) == 1 and fake_openai.response_formats


TRANSIENT = ["429", "500", "drop", "slow", "invalid_json", "truncated", "refusal"]


def test_each_transient_fault_is_retried_and_every_step_gets_one_verdict(
    fake_openai, tmp_path, example_traces, example_prompts, examples_dir, replay_verdicts
):
    fake_openai.slow_seconds = 2.5  # past the 1 s client timeout
    keys = list(dict.fromkeys(example_prompts.values()))
    for fault, key in zip(TRANSIENT, keys, strict=False):
        fake_openai.faults[key] = [fault]
    verdicts = _run(_judge(fake_openai, tmp_path), example_traces, examples_dir)
    assert sorted((v.trace_id, v.step) for v in verdicts) == sorted(replay_verdicts)
    assert all(v.error is None for v in verdicts)
    assert all(v.label == replay_verdicts[(v.trace_id, v.step)].label for v in verdicts)
    by_key: dict[str, list] = {}
    for e in fake_openai.events:
        by_key.setdefault(e.key, []).append(e)
    for fault, key in zip(TRANSIENT, keys, strict=False):
        attempts = by_key[key]
        assert [e.action for e in attempts] == [fault, "ok"], fault
    first, second = by_key[keys[0]]  # 429 with Retry-After: 1
    assert second.time - first.time >= 0.9


@pytest.mark.parametrize(
    ("fault", "times", "message"),
    [
        ("invalid_json", 3, "not JSON"),
        ("truncated", 3, "truncated"),
        ("refusal", 3, "refused"),
        ("500", 3, "judge API error"),
        ("slow", 3, "judge API error"),
        ("drop", 3, "judge API error"),
    ],
)
def test_a_persistent_fault_becomes_an_error_verdict_never_a_label(
    fault, times, message, fake_openai, tmp_path, example_traces, example_prompts, examples_dir
):
    fake_openai.slow_seconds = 1.5
    key = example_prompts[("case1-whitehorse", 1)]
    fake_openai.faults[key] = [fault] * times
    verdicts = _run(
        _judge(fake_openai, tmp_path, invalid_retries=2, max_retries=2),
        example_traces,
        examples_dir,
    )
    assert len(verdicts) == 28
    (bad,) = [v for v in verdicts if v.error]
    assert (bad.trace_id, bad.step, bad.label) == ("case1-whitehorse", 1, None)
    assert message in bad.error
    # Failures are not cached: the next run asks again and now gets an answer.
    again = _run(_judge(fake_openai, tmp_path), example_traces, examples_dir)
    assert all(v.error is None for v in again)


def test_bad_credentials_stop_the_run(fake_openai, tmp_path, example_traces, examples_dir):
    for key in fake_openai.answers:
        fake_openai.faults[key] = ["401"]
    with pytest.raises(JudgeConfigError, match="refused the credentials"):
        _run(_judge(fake_openai, tmp_path), example_traces, examples_dir)


def test_missing_key_without_base_url_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(JudgeConfigError, match=r"\$OPENAI_API_KEY"):
        build_judge("openai:gpt-4.1-mini")


def test_a_judge_that_fails_to_build_leaves_no_cache_file(monkeypatch, tmp_path):

    cache = tmp_path / "cache" / "judge-cache.sqlite"
    monkeypatch.setenv("STEPGAP_CACHE", str(cache))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(JudgeConfigError, match=r"\$OPENAI_API_KEY"):
        build_judge("openai:gpt-4.1-mini")
    assert not cache.parent.exists()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    judge = build_judge("openai:gpt-4.1-mini")  # built: its cache is made at once
    assert judge.cache is not None and cache.is_file() and len(judge.cache) == 0


def test_price_table_file_and_prefix_match(tmp_path):
    from stepgap.teacher.judges.cost import load_prices, price_for

    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"my-model": {"input": 1.0, "output": 2.0}}))
    table = load_prices(path)
    assert price_for("my-model", table) == (1.0, 1.0, 2.0)
    meter = CostMeter(model="gpt-4.1-mini-2025-04-14")  # dated snapshot -> gpt-4.1-mini
    meter.add({"prompt_tokens": 1_000_000, "cached_tokens": 500_000, "completion_tokens": 0})
    assert meter.cost == pytest.approx(0.5 * 0.40 + 0.5 * 0.10)
    assert meter.summary().endswith("API call(s), 0 cache hit(s), 0 failed step(s); tokens in "
                                    "1000000 (cached 500000), out 0; cost $0.2500")  # fmt: skip
    # a served model without a price is not free: the summary says the cost is unknown
    unpriced = CostMeter(model="qwen-judge")
    assert unpriced.summary().endswith("cost unknown: no price for qwen-judge (add one with "
                                       "--prices FILE)")  # fmt: skip
    # a model in this process answers without an API: neither calls nor a cost are claimed
    local = CostMeter(model="student:x", local=True)
    local.add({"prompt_tokens": 10, "completion_tokens": 5})
    assert local.summary() == (
        "judge student:x: 1 answer(s), 0 cache hit(s), 0 failed step(s); tokens in 10 "
        "(cached 0), out 5"
    )
    path.write_text(json.dumps({"bad": {"input": "x"}}))
    with pytest.raises(ValueError, match="bad"):
        load_prices(path)


@pytest.mark.parametrize(
    ("refused", "used"),
    [
        (set(), "json_schema"),  # OpenAI, vLLM, SGLang, llama.cpp's server
        ({"json_schema"}, "json_object"),  # llama-cpp-python's server: 500 on json_schema
        ({"json_schema", "json_object"}, "none"),  # a server with no JSON mode at all
    ],
)
def test_auto_response_format_finds_what_the_server_takes_in_one_probe(
    fake_openai, tmp_path, example_traces, examples_dir, replay_verdicts, refused, used
):
    fake_openai.refuse_formats = refused
    judge = _judge(fake_openai, tmp_path)
    verdicts = _run(judge, example_traces, examples_dir)
    assert judge.response_format == used
    assert [(v.label, v.path) for v in verdicts] == [
        (replay_verdicts[(v.trace_id, v.step)].label, replay_verdicts[(v.trace_id, v.step)].path)
        for v in verdicts
    ]
    # each refused format cost one request and its one retry; every step was then asked once
    assert fake_openai.formats_seen.count(used) == 28
    assert len(fake_openai.formats_seen) == 28 + 2 * len(refused)


def test_a_fixed_response_format_is_never_changed(
    fake_openai, tmp_path, example_traces, examples_dir
):
    fake_openai.refuse_formats = {"json_schema"}
    judge = _judge(fake_openai, tmp_path, response_format="json_schema", max_retries=0)
    with pytest.raises(JudgeConfigError, match="failed its first 3 requests the same way"):
        _run(judge, example_traces, examples_dir)
    assert set(fake_openai.formats_seen) == {"json_schema"} and len(fake_openai.formats_seen) == 3
    with pytest.raises(ValueError, match="response_format must be"):
        build_judge("openai:m", base_url="http://x", response_format="yaml")


def test_a_completion_is_read_from_the_answer_json_and_a_bad_body_is_a_problem():
    from stepgap.teacher.judges.openai_wire import Completion

    body = {
        "choices": [
            {
                "message": {"content": '{"a": 1}', "refusal": None},
                "finish_reason": "stop",
                "logprobs": {"content": [{"token": '{"', "logprob": -0.5, "top_logprobs": []}]},
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "prompt_tokens_details": None},
    }
    c = Completion.of(json.dumps(body).encode())
    assert (c.content, c.finish_reason, c.problem) == ('{"a": 1}', "stop", None)
    assert c.logprobs == [('{"', -0.5)]
    assert c.usage == {"prompt_tokens": 7, "completion_tokens": 3, "cached_tokens": 0}
    empty = Completion.of(b'{"choices": [], "usage": {"prompt_tokens": 2}}')
    assert empty.problem == "the server returned no choices" and empty.usage["prompt_tokens"] == 2
    assert Completion.of(b"<html>bad gateway</html>").problem.startswith(
        "the server's answer is not JSON"
    )
    assert Completion.of(b"[1, 2]").problem == "the server's answer is not a JSON object"
    assert Completion.of(b'{"choices": [{"message": {}}]}').usage == {}
    for odd in (b'{"choices": ["text"]}', b'{"choices": [{"logprobs": {"content": [{}]}}]}'):
        assert Completion.of(odd).problem.startswith("the server's answer is not a chat completion")


def test_one_model_name_on_two_servers_shares_no_cache_and_check_prints_its_hits(
    fake_openai, example_answers, examples_dir, tmp_path, capsys
):
    """The same `openai:NAME` against two servers with one cache file: the second server is
    asked every step (its answers are its own), and a rerun against the first is all hits."""
    from stepgap.cli import main
    from tests.fixtures.openai_server import FakeOpenAI

    other = FakeOpenAI(answers=dict(example_answers)).start()
    cache = tmp_path / "cache.sqlite"

    def check(server) -> str:
        rc = main([
            "check", str(examples_dir / "traces.jsonl"), "-o", str(tmp_path / "v.jsonl"),
            "--judge", "openai:gpt-4.1-mini", "--base-url", server.base_url, "--cache",
            str(cache), "--nli", f"replay:{examples_dir / 'nli_replay.jsonl'}", "--no-progress",
        ])  # fmt: skip
        assert rc == 0
        return capsys.readouterr().err

    try:
        check(fake_openai)
        check(other)
        again = check(fake_openai)
    finally:
        other.stop()
    assert len(fake_openai.answered()) == 28 and len(other.answered()) == 28
    assert "0 API call(s), 28 cache hit(s)" in again


def test_the_judge_and_a_policy_read_their_key_from_the_environment_only(monkeypatch):
    """One set-up for every OpenAI client: OpenAI's own server needs the key's variable set;
    a server given by URL needs none; the message names the variable, never a value."""
    from stepgap.data_builders.policies import OpenAIPolicy
    from stepgap.teacher.judges.openai_api import OpenAIJudge, OpenAIJudgeOptions
    from stepgap.teacher.judges.openai_wire import MissingAPIKeyError

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("MY_KEY", raising=False)
    for make in (
        lambda: OpenAIJudge("gpt-4.1-mini", OpenAIJudgeOptions(api_key_env="MY_KEY")),
        lambda: OpenAIPolicy("gpt-4.1-mini", api_key_env="MY_KEY"),
    ):
        with pytest.raises(MissingAPIKeyError, match=r"reads its API key from \$MY_KEY"):
            make()
    policy = OpenAIPolicy("m", base_url="http://127.0.0.1:9/v1", api_key_env="MY_KEY")
    assert str(policy.client.base_url).startswith("http://127.0.0.1:9/v1")
    monkeypatch.setenv("MY_KEY", "sk-test")
    assert OpenAIPolicy("m", api_key_env="MY_KEY").client.api_key == "sk-test"
    assert (
        OpenAIJudge("m", OpenAIJudgeOptions(api_key_env="MY_KEY"))._new_client().api_key
        == "sk-test"
    )


def test_the_test_server_takes_a_client_that_resets_without_a_traceback(capfd):
    """Tests make clients leave mid-request (timeouts, cancelled calls); the stand-in server
    takes the reset quietly instead of printing a traceback into the test output."""
    import socket
    import struct
    import time

    from tests.fixtures.openai_server import FakeOpenAI

    server = FakeOpenAI().start()
    try:
        client = socket.create_connection(server.httpd.server_address)
        client.sendall(b"POST /v1/chat")  # a request line never finished
        time.sleep(0.2)  # the server is reading it
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset, not a clean close
        time.sleep(0.5)
    finally:
        server.stop()
    assert "Traceback" not in capfd.readouterr().err


def test_a_server_that_takes_a_connection_and_drops_it_is_not_reached():
    """The check behind a dropped request: a listener that accepts and holds a connection is a
    server up; one that accepts and closes it at once (a server killed as it took it) is not."""
    import asyncio

    from stepgap.teacher.judges.openai_wire import connects

    async def held(reader, writer):
        await reader.read()  # until the client closes

    async def dropped(reader, writer):
        writer.close()

    async def check(handler):
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await connects("127.0.0.1", port, settle=5.0 if handler is dropped else 0.05)

    assert asyncio.run(check(held)) is True
    assert asyncio.run(check(dropped)) is False
