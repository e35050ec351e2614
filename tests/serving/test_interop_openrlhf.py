"""The reward through OpenRLHF 0.11.2's own code: its reward client against a live `stepgap
serve` and the reward_func file, and its `train_ppo_ray` parser against the flags README.md
shows (the `interop` extra installs OpenRLHF beside the suite; `make test-peers` runs this file
again at OpenRLHF's own pins, transformers 5.15.0 and ray 2.55.0). Rewards must equal those of
the stored example verdicts."""

from __future__ import annotations

import argparse
import ast
import asyncio
import importlib.util
import itertools
import re
import shlex
from pathlib import Path

import pytest

import stepgap.serving
from tests.fixtures.peers import import_peer
from tests.serving.conftest import chat_prompt

import_peer("openrlhf")

SERVING = Path(stepgap.serving.__file__).parent
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


def test_openrlhf_client_gets_rewards_from_serve_and_from_the_reward_func_file(
    served, example_traces, expected_rewards, monkeypatch
):
    """OpenRLHF's own `SingleTurnAgentExecutor`: `--reward.remote_url URL` (two URLs in turn)
    and `--reward.remote_url .../stepgap/serving/openrlhf.py` (its `reward_func`, in process)."""
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    prompts = [chat_prompt(t.question) for t in example_traces]
    queries = [p + t.response for p, t in zip(prompts, example_traces, strict=True)]
    labels = [t.golden_answers for t in example_traces]
    expected = [expected_rewards[t.id] for t in example_traces]

    http = SingleTurnAgentExecutor([f"{served}/get_reward", f"{served}/get_reward"])
    answers = asyncio.run(http._fetch_rewards_via_http(queries, prompts, labels))
    assert [r for a in answers for r in a["rewards"]] == pytest.approx(expected)

    monkeypatch.setenv("STEPGAP_REWARD_URL", served)
    func = SingleTurnAgentExecutor(str(SERVING / "openrlhf.py"))
    answers = asyncio.run(func._fetch_rewards_via_func(queries, prompts, labels))
    assert [r for a in answers for r in a["rewards"]] == pytest.approx(expected)
    assert set(answers[0]["extra_logs"]) >= {"em", "dense", "failed_checks"}


def openrlhf_train_parser() -> argparse.ArgumentParser:
    """OpenRLHF's own `train_ppo_ray` parser. It is built under `if __name__ == "__main__":`
    and the module imports vLLM and DeepSpeed, which the interop extra leaves out, so its
    importable imports and the statements of that block up to `parse_args` run as written."""
    spec = importlib.util.find_spec("openrlhf.cli.train_ppo_ray")
    assert spec is not None and spec.origin
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    namespace: dict = {"__name__": "openrlhf.cli.train_ppo_ray"}

    def run(statements: list[ast.stmt]) -> None:
        exec(compile(ast.Module(body=statements, type_ignores=[]), spec.origin, "exec"), namespace)

    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            try:
                run([node])
            except ImportError:  # vllm, deepspeed: the parser does not use them
                pass
    main = next(
        n for n in tree.body
        if isinstance(n, ast.If) and ast.unparse(n.test) == "__name__ == '__main__'"
    )  # fmt: skip
    run(list(itertools.takewhile(lambda s: "parse_args" not in ast.unparse(s), main.body)))
    parser = namespace["parser"]
    parser.exit_on_error = False  # a bad value raises instead of exiting the test run
    return parser


def readme_openrlhf_commands() -> list[str]:
    """Every code span of the OpenRLHF page (docs/rl/openrlhf.md) and of the README's OpenRLHF
    line that is OpenRLHF's command-line arguments (`--group.key`; a `stepgap serve` flag such as
    `--client-timeout` is not one)."""
    page = (REPO / "docs" / "rl" / "openrlhf.md").read_text(encoding="utf-8")
    readme = [
        p for p in (REPO / "README.md").read_text().split("\n\n") if p.startswith("OpenRLHF:")
    ]
    assert len(readme) == 1, "README.md: the OpenRLHF line of the quickstart"
    prose = re.sub(r"```.*?```", " ", "\n\n".join([page, *readme]), flags=re.S)  # no fences
    spans = re.findall(r"`([^`]+)`", prose.replace("\n", " "))
    return [s for s in spans if s.startswith("--") and "." in s.split()[0]]


def test_every_openrlhf_flag_in_the_docs_is_one_its_train_ppo_ray_takes():
    parser = openrlhf_train_parser()
    _, unknown = parser.parse_known_args(["--remote_rm_url", "http://h:8000/get_reward"])
    assert unknown, "the old flag must be refused, or this parser is not OpenRLHF's"
    commands = readme_openrlhf_commands()
    assert any("--reward.remote_url" in c for c in commands)
    assert any("--train.agent_func_path" in c for c in commands)
    for command in commands:
        _, unknown = parser.parse_known_args(shlex.split(command))
        assert not unknown, f"the docs: OpenRLHF's train_ppo_ray does not take {unknown}"
