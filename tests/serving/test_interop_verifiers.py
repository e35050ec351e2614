"""stepgap's search environment run by verifiers 0.4's own loader and eval loop
(`serving/verifiers_env.py`, known to verifiers as `stepgap-search`).

`vf-eval stepgap-search` runs in this process (its `main`, as the console script calls it)
against a scripted policy on 127.0.0.1 that replays example traces' Search-R1 turns as `search`
tool calls; the tool asks a local BM25 index behind the retrieval server; the judge is an
OpenAI-compatible server on 127.0.0.1 and the NLI the tiny DeBERTa. Each rollout's reward, read
from the run's traces.jsonl, must be `StepGapReward.score` of its completion's text.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.fixtures.peers import import_peer

import_peer("verifiers")

from tests.fixtures.live_server import LiveServer  # noqa: E402
from tests.fixtures.policy_server import ScriptedPolicy, search_turns  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENVIRONMENT = ROOT / "environments" / "stepgap_search"
EXAMPLE = ROOT / "examples" / "verifiers_search.py"
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(autouse=True)
def stepgap_search(monkeypatch):
    """The `stepgap_search` module on the path, as `pip install ./environments/stepgap_search`
    puts it there."""
    if importlib.util.find_spec("stepgap_search") is None:
        monkeypatch.syspath_prepend(str(ENVIRONMENT))


@pytest.fixture(scope="module")
def traces(example_traces):
    """Example traces that search, then answer (three keep the run short)."""
    kept = [t for t in example_traces if len(search_turns(t)) >= 2 and "<tool_call>" not in
            t.response and search_turns(t)[-1]["content"].endswith("</answer>")]  # fmt: skip
    return kept[:3]


@pytest.fixture
def qa_file(tmp_path, traces) -> Path:
    path = tmp_path / "questions.jsonl"
    rows = [
        {"id": t.id, "question": t.question, "golden_answers": t.golden_answers} for t in traces
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def policy(traces):
    server = ScriptedPolicy({t.question: search_turns(t) for t in traces}).start()
    yield server
    server.stop()


def vf_eval(tmp_path, qa_file, policy, retriever_url, *flags: str) -> list[dict]:
    """`vf-eval stepgap-search ...` in this process; the run's traces (traces.jsonl)."""
    from verifiers.v1.cli.eval.main import main

    out = tmp_path / "runs"
    main(["stepgap-search", "--env.taskset.qa", str(qa_file),
          "--env.taskset.task.retriever-url", retriever_url, "-m", "scripted",
          "--client.base-url", policy.base_url, "--no-push", "--no-rich", "-o", str(out),
          "--run.name", "run", *flags])  # fmt: skip
    lines = (out / "run" / "traces.jsonl").read_text(encoding="utf-8").splitlines()
    episodes = [json.loads(line) for line in lines]
    return [t for e in episodes for t in e["traces"]]


def completion_text(trace: dict) -> tuple[str, list[dict]]:
    """The text the reward reads from a traced rollout (its messages after the prompt)."""
    from stepgap.serving.framework_inputs import text_of
    from stepgap.serving.verifiers_env import completion_of

    messages = [node["message"] for node in trace["nodes"]]
    completion = completion_of(messages)
    return text_of(completion), completion


def post_hoc(reward, trace: dict):
    """`StepGapReward.score` of the rollout's text: what `stepgap reward` gives it."""
    text, _ = completion_text(trace)
    data = trace["task"]["data"]
    (result,) = reward.score([text], [data["question"]], [data["golden_answers"]])
    return result


@pytest.fixture
def no_reward_configured(monkeypatch):
    from stepgap.serving import inline, process_reward

    for name in ("STEPGAP_REWARD_URL", "STEPGAP_REWARD_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    inline.reset()
    process_reward.reset()
    yield
    inline.reset()
    process_reward.reset()


def test_the_loader_finds_the_environment_by_its_taskset_id(qa_file, traces, no_reward_configured):
    import verifiers.v1 as vf

    from stepgap.serving import verifiers_env as module

    task = {"url": "http://127.0.0.1:9"}  # a `stepgap serve` (not asked: nothing runs)
    config = vf.resolve_env_config(
        {"taskset": {"id": "stepgap-search", "qa": str(qa_file), "task": task}}
    )
    env = vf.load_environment(config)
    assert isinstance(env, module.StepgapSearchEnv)
    assert isinstance(env.taskset, module.StepgapSearchTaskset)
    assert config.agent_harnesses()["agent"].id == "stepgap-search"  # the taskset's harness
    assert config.agent.runtime.type == "subprocess"
    tasks = list(env.taskset)
    assert [t.data.question for t in tasks] == [t.question for t in traces]
    assert all(f"Question: {t.data.question}" in t.data.prompt_text for t in tasks)
    assert all(
        t.data.golden_answers == s.golden_answers for t, s in zip(tasks, traces, strict=True)
    )
    # the same from keyword arguments (older verifiers' `load_environment(**kwargs)` idiom)
    env = module.load_environment(str(qa_file), url="http://127.0.0.1:9", topk=5)
    assert isinstance(env, module.StepgapSearchEnv) and env.taskset.config.task.topk == 5
    with pytest.raises(TypeError, match="retriever_ulr"):
        module.load_environment(str(qa_file), retriever_ulr="http://127.0.0.1:9/x")


def test_without_a_reward_vf_eval_stops_before_any_rollout(
    tmp_path, qa_file, policy, retriever_url, no_reward_configured
):
    with pytest.raises(ValueError, match="--env.taskset.task.url"):
        vf_eval(tmp_path, qa_file, policy, retriever_url)
    assert policy.requests == []


def rollout_text(source, retriever_url: str) -> str:
    """The text a rollout replaying `source` must have, written here from the scripted turns
    and the retriever's answers as Qwen2.5's template writes a tool-calling conversation."""
    from stepgap.data_builders.retrieval import search_passages, tool_retriever
    from stepgap.data_builders.rollout_formats import tool_call_text, tool_response_text

    retriever, parts = tool_retriever(retriever_url), []
    for turn in search_turns(source):
        calls = [json.loads(c["arguments"])["query"] for c in turn.get("tool_calls", [])]
        parts.append("\n".join([turn["content"], *(tool_call_text("search", {"query": q})
                                                     for q in calls)]))  # fmt: skip
        parts += [tool_response_text(search_passages(retriever, q, 3)) for q in calls]
    return "\n".join(parts)


def test_vf_evals_rewards_are_stepgaps_reward_of_each_rollout(
    inline_reward, tmp_path, qa_file, policy, retriever_url, traces
):
    from stepgap.segment import segment_response
    from stepgap.serving import inline, process_reward

    process_reward.configure(inline_reward)
    got = vf_eval(tmp_path, qa_file, policy, retriever_url)
    assert len(got) == len(traces)
    (checker,) = inline._CHECKERS.values()
    searches = sum(len(search_turns(t)) - 1 for t in traces)
    assert checker.streaming.stats["submitted"] == searches  # each step sent as it came
    inline_reward.checker.judge.asked.clear()
    for trace in got:
        assert trace["ok"], trace.get("errors")
        data = trace["task"]["data"]
        source = next(t for t in traces if t.question == data["question"])
        text, completion = completion_text(trace)
        assert text == rollout_text(source, retriever_url)
        (expected,) = inline_reward.score([text], [source.question], [source.golden_answers])
        assert expected.reward is not None
        assert trace["rewards"]["stepgap"]["score"] == pytest.approx(expected.reward, abs=1e-9)
        tools = [m for m in completion if m["role"] == "tool"]
        assert len(expected.steps) == len(tools) + 1  # every search a step, then the answer
        assert [s.query for s in segment_response(text)] == [s.query for s in source.steps]
        logs = trace["metrics"]
        for name, value in expected.scalars().items():
            if f"stepgap/{name}" in logs:
                assert logs[f"stepgap/{name}"] == pytest.approx(value, abs=1e-9)
        assert logs["stepgap/no_reward"] == 0.0 and "stepgap/rate_no_gap" in logs
        pieces = trace["info"]["stepgap"]["turn_rewards"]
        assert len(pieces) == len(tools) + 1
        assert sum(pieces) == pytest.approx(expected.reward, abs=1e-9)


def load_example():
    spec = importlib.util.spec_from_file_location("verifiers_search", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_says_what_it_needs():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(EXAMPLE), "--help"], capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    assert "--reward-url" in done.stdout and "--retriever-url" in done.stdout


def test_the_example_through_stepgap_serve_gets_the_same_rewards(
    inline_reward, tmp_path, qa_file, policy, retriever_url, traces
):
    """`examples/verifiers_search.py` (vf-eval's own main) with the reward from `stepgap
    serve`: each search's step goes to its /steps as it comes, and each rollout's reward is
    `StepGapReward.score` of its text."""
    import httpx

    from stepgap.serving.server import create_app

    out = tmp_path / "runs"
    with LiveServer(create_app(inline_reward)) as url:
        rows = load_example().main(["--model", "scripted", "--base-url", policy.base_url,
                                    "--retriever-url", retriever_url, "--reward-url", url,
                                    "--questions", str(qa_file), "-n", "5",
                                    "--output", str(out), "--run", "run"])  # fmt: skip
        metrics = httpx.get(f"{url}/metrics").text
    searches = sum(len(search_turns(t)) - 1 for t in traces)  # each step sent as it came
    assert f'stepgap_requests_total{{route="steps"}} {float(searches)}' in metrics
    inline_reward.checker.judge.asked.clear()
    got = [t for line in (out / "run" / "traces.jsonl").read_text().splitlines()
           for t in json.loads(line)["traces"]]  # fmt: skip
    assert len(got) == len(rows) == len(traces)
    for trace, row in zip(got, rows, strict=True):
        assert trace["ok"], trace.get("errors")
        expected = post_hoc(inline_reward, trace).reward
        assert trace["rewards"]["stepgap"]["score"] == pytest.approx(expected, abs=1e-9)
        assert row["reward"] == trace["rewards"]["stepgap"]["score"]


def test_with_a_reward_config_file_the_check_runs_in_the_eval(
    inline_reward, any_judge_server, tiny_nli, tmp_path, qa_file, policy, retriever_url
):
    """`--env.taskset.task.config FILE` (a judge and an NLI model, as `stepgap serve` takes
    them): the checker is built in vf-eval's process from the file, with the same rewards."""
    config = {"judge": "openai:gpt-4.1-mini", "base_url": any_judge_server.base_url,
              "nli": str(tiny_nli), "max_retries": 0, "no_cache": True}  # fmt: skip
    path = tmp_path / "reward.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    got = vf_eval(tmp_path, qa_file, policy, retriever_url, "--env.taskset.task.config", str(path))
    assert inline_reward.checker.judge.asked == []  # not this reward's checker: the file's
    assert got and all(t["ok"] for t in got)
    for trace in got:
        expected = post_hoc(inline_reward, trace).reward
        assert trace["rewards"]["stepgap"]["score"] == pytest.approx(expected, abs=1e-9)


def test_the_vf_eval_command_runs_it(inline_reward, tmp_path, qa_file, policy, retriever_url):
    """verifiers' own console script, in its own process, as a user types it: the reward
    from `stepgap serve` (here, in this process), the environment found by its id."""
    import os
    import subprocess
    import sys

    from stepgap.serving.server import create_app

    out = tmp_path / "runs"
    command = [str(Path(sys.executable).parent / "vf-eval"), "stepgap-search", "-m", "scripted",
               "--client.base-url", policy.base_url, "--env.taskset.qa", str(qa_file),
               "--env.taskset.task.retriever-url", retriever_url, "--no-push", "--no-rich",
               "-o", str(out), "--run.name", "run"]  # fmt: skip
    path = os.pathsep.join(filter(None, [str(ENVIRONMENT), os.environ.get("PYTHONPATH")]))
    with LiveServer(create_app(inline_reward)) as url:
        done = subprocess.run([*command, "--env.taskset.task.url", url], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "PYTHONPATH": path})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    inline_reward.checker.judge.asked.clear()
    got = [t for line in (out / "run" / "traces.jsonl").read_text().splitlines()
           for t in json.loads(line)["traces"]]  # fmt: skip
    assert got and all(t["ok"] for t in got)
    for trace in got:
        expected = post_hoc(inline_reward, trace).reward
        assert trace["rewards"]["stepgap"]["score"] == pytest.approx(expected, abs=1e-9)


def test_typed_notes_reach_the_policy_in_its_tool_responses(
    inline_reward, tmp_path, qa_file, policy, retriever_url
):
    """With a wait long enough for every verdict, each search's tool response, as the policy
    receives it, ends with the note of its step's post-hoc label (none for no_gap); the reward
    is the post-hoc reward of the final text, notes and all."""
    from stepgap.feedback import note_for
    from stepgap.serving import process_reward

    process_reward.configure(inline_reward)
    flags = ("--env.taskset.task.feedback", "typed", "--env.taskset.task.feedback-wait", "120")
    got = vf_eval(tmp_path, qa_file, policy, retriever_url, *flags)
    inline_reward.checker.judge.asked.clear()
    sent = []
    for trace in got:
        assert trace["ok"], trace.get("errors")
        result = post_hoc(inline_reward, trace)
        expected = [n for n in (note_for(s.label) for s in result.steps[:-1]) if n]
        question = trace["task"]["data"]["question"]
        last = max((r for r in policy.requests if question in json.dumps(r["messages"])),
                   key=lambda r: len(r["messages"]))  # fmt: skip
        shown = [m["content"] for m in last["messages"] if m["role"] == "tool"]
        notes = [n for c in shown for n in expected if c.endswith(f"\n{n}")]
        assert notes == expected and sum("<feedback>" in c for c in shown) == len(expected)
        assert trace["metrics"]["stepgap/feedback/notes"] == len(expected)
        assert trace["rewards"]["stepgap"]["score"] == pytest.approx(result.reward, abs=1e-9)
        sent += notes
    assert sent  # some step is a gap


def test_a_failed_check_is_verifiers_error_never_a_zero(
    tiny_nli, tmp_path, qa_file, policy, retriever_url, traces
):
    """The judge answers 500 to everything: each rollout is an errored one in verifiers'
    terms (not ok, its reward unscored, the reason in its errors), which `vf-eval --resume`
    re-runs; its metrics say why."""
    from stepgap.serving import StepGapReward, inline, process_reward
    from stepgap.teacher import Checker, build_judge, load_nli
    from tests.fixtures.openai_server import FakeOpenAI

    down = FakeOpenAI(answers={}, always="500").start()
    try:
        judge = build_judge("openai:gpt-4.1-mini", base_url=down.base_url, max_retries=0,
                            no_cache=True)  # fmt: skip
        inline.reset()
        process_reward.configure(StepGapReward(Checker(judge, load_nli(str(tiny_nli)))))
        got = vf_eval(tmp_path, qa_file, policy, retriever_url)
    finally:
        down.stop()
        inline.reset()
        process_reward.reset()
    assert len(got) == len(traces)
    for trace in got:
        assert not trace["ok"]
        assert trace["rewards"]["stepgap"] is None  # unscored, not 0
        assert any("no reward" in e["message"] for e in trace["errors"]), trace["errors"]
        assert trace["metrics"]["stepgap/no_reward"] == 1.0
        assert trace["metrics"]["stepgap/failed_checks"] > 0
