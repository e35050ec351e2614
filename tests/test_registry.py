"""Backends by spec (stepgap/registry.py): stepgap's own are listed in code, plug-ins come by entry
point, every spec kind parses the same way, what a backend builds is of its kind's interface, and
an option a backend does not take is an error naming the option and the backend. The plug-in is a throwaway distribution the test
installs into a folder on the path (its `*.dist-info` with `entry_points.txt`, as pip writes it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stepgap.registry import Backend, BackendOptionError, Registry, UnknownBackendError

REPO = Path(__file__).resolve().parents[1]

PLUGIN_JUDGE = '''
import json
from dataclasses import dataclass

from stepgap.options import Options, option
from stepgap.schema import Judge
from stepgap.teacher.judges import JudgeBackend
from stepgap.tree import JudgeResult


@dataclass(frozen=True)
class EchoOptions(Options):
    copies: int = option(1, "how many copies")


class EchoJudge(JudgeBackend):
    """Gives every step the judge object of the JSON file its spec names."""

    name = "echo"
    options_class = EchoOptions

    def __init__(self, path, options=None):
        self.path, self.copies = path, (options or EchoOptions()).copies
        with open(path) as f:
            self.answer = Judge.model_validate(json.load(f))

    @property
    def provenance(self):
        return {"spec": f"echo:{self.path}", "note": None}

    def judge(self, requests, *, stop=None):
        return [JudgeResult(judge=self.answer) for _ in requests]
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch) -> Path:
    """A distribution `echo-judge` installed into `site/`: a module and its entry point."""
    site = tmp_path / "site"
    (site / "echo_judge.py").parent.mkdir(parents=True)
    (site / "echo_judge.py").write_text(PLUGIN_JUDGE)
    info = site / "echo_judge-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-judge\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[stepgap.judges]\necho = echo_judge:EchoJudge\n")
    monkeypatch.syspath_prepend(str(site))
    return site


def test_stepgaps_own_backends_are_listed_in_code_not_in_entry_points():
    """Each kind's built-ins are in its registry's `builtin` table (grepping the code for a kind
    finds it), the judges' in the modules of `teacher/judges` (`JUDGES.builtins()`: every one has
    its page and its flags, tests/teacher/judges/test_judge_modules.py); stepgap's own metadata
    declares no backend, so entry points are plug-ins only.
    The student's judge joins the judges when `stepgap.student` is imported, a layer above."""
    from importlib.metadata import distribution

    from stepgap.data_builders.policies import POLICIES
    from stepgap.data_builders.retrieval import RETRIEVERS
    from stepgap.eval.baselines import BASELINES
    from stepgap.teacher.judges import JUDGES
    from stepgap.teacher.nli import NLI_BACKENDS

    assert {"openai", "hf", "replay"} <= set(JUDGES.builtins())  # found in teacher/judges
    assert set(NLI_BACKENDS.builtin) == {"hf", "onnx", "replay"}
    assert set(POLICIES.builtin) == {"hf", "openai"}
    assert set(RETRIEVERS.builtin) == {"index", "http", "https"}
    assert set(BASELINES.builtin) == {
        "nli-only", "minicheck", "ner-quote", "llm-strict", "llm-only", "flag-everything",
    }  # fmt: skip
    for registry in (JUDGES, NLI_BACKENDS, POLICIES, RETRIEVERS, BASELINES):
        for kind in registry.builtins():
            assert issubclass(registry.backend(kind), registry.interface), (registry.what, kind)
    own = [ep.group for ep in distribution("stepgap").entry_points if ep.group != "console_scripts"]
    assert own == []
    from stepgap.student.judge import StudentJudge

    assert JUDGES.backend("student") is StudentJudge


def test_a_plugin_that_is_not_of_its_kinds_interface_is_named(tmp_path):
    """A backend must be a subclass of its kind's abstract class; one that is not is one
    error naming the backend and the class to subclass, before anything is built."""
    from stepgap.registry import BackendTypeError
    from stepgap.teacher.judges import JUDGES

    def plain(arg):
        raise AssertionError("a backend of the wrong kind is never called")

    JUDGES.register("plain", plain)  # type: ignore[arg-type]
    try:
        with pytest.raises(BackendTypeError, match="judge backend 'plain' is plain, which is not "
                           "a subclass of stepgap.teacher.judges.base.JudgeBackend: subclass it"):  # fmt: skip
            JUDGES.build("plain:x")
    finally:
        JUDGES._added.pop("plain")


def test_every_kind_parses_the_same_way():
    from stepgap.data_builders.policies import POLICIES
    from stepgap.data_builders.retrieval import RETRIEVERS
    from stepgap.eval.baselines import BASELINES
    from stepgap.teacher.judges import JUDGES
    from stepgap.teacher.nli import NLI_BACKENDS

    assert JUDGES.parse("openai:gpt-4.1-mini") == ("openai", "gpt-4.1-mini")
    assert NLI_BACKENDS.parse("onnx:/b/nli") == ("onnx", "/b/nli")
    assert NLI_BACKENDS.parse("MoritzLaurer/DeBERTa-v3-large") == (
        "hf", "MoritzLaurer/DeBERTa-v3-large",
    )  # fmt: skip
    assert POLICIES.parse("openai:qwen") == ("openai", "qwen")
    assert POLICIES.parse("/models/policy") == ("hf", "/models/policy")
    assert RETRIEVERS.parse("http://127.0.0.1:8000/retrieve") == (
        "http", "//127.0.0.1:8000/retrieve",
    )  # fmt: skip
    assert RETRIEVERS.parse("~/index") == ("index", "~/index")
    assert BASELINES.parse("minicheck") == ("minicheck", "")
    with pytest.raises(
        UnknownBackendError,
        match=r"unknown judge spec 'gpt-4.1-mini'.*did you mean openai:gpt-4.1-mini ",
    ):
        JUDGES.parse("gpt-4.1-mini")
    with pytest.raises(UnknownBackendError, match=r"spec 'foo:bar'; expected .*judges\)$"):
        JUDGES.parse("foo:bar")  # a KIND: that is not installed: nothing to guess
    with pytest.raises(UnknownBackendError, match="stepgap.baselines"):
        BASELINES.parse("nope")


def test_an_option_a_backend_does_not_take_is_an_error_naming_both(tmp_path):
    from stepgap.data_builders.policies import load_policy
    from stepgap.teacher.judges import build_judge
    from stepgap.teacher.nli import load_nli

    replay = REPO / "examples" / "judge_replay.jsonl"
    with pytest.raises(BackendOptionError, match="judge backend 'replay' takes no option "
                       "'concurrency'"):  # fmt: skip
        build_judge(f"replay:{replay}", concurrency=4)
    with pytest.raises(BackendOptionError, match="'openai' takes no option 'judge_device'"):
        build_judge("openai:gpt-4.1-mini", judge_device="cuda", api_key_env="NO_SUCH_KEY_VAR")
    with pytest.raises(BackendOptionError, match="NLI backend 'replay' takes no option 'device'"):
        load_nli(f"replay:{replay}", device="cpu")
    with pytest.raises(BackendOptionError, match="policy backend 'openai' takes no option 'dtype'"):
        load_policy("openai:qwen", {"dtype": "bfloat16"})
    # the options of another backend's class are refused as a whole, naming the class it takes
    from stepgap.teacher.judges.hf import HFJudgeOptions

    with pytest.raises(BackendOptionError, match="'openai' takes OpenAIJudgeOptions, not HFJudge"):
        build_judge("openai:gpt-4.1-mini", HFJudgeOptions())


def test_an_option_error_reaches_the_command_line_in_one_line(examples_dir, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "stepgap.cli", "check", str(examples_dir / "traces.jsonl"),
         "-o", str(tmp_path / "v.jsonl"), "--judge", f"replay:{examples_dir / 'judge_replay.jsonl'}",
         "--nli", f"replay:{examples_dir / 'nli_replay.jsonl'}", "--concurrency", "3"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    replay = f"replay:{examples_dir / 'judge_replay.jsonl'}"
    said = f"error: option concurrency (--concurrency) does not apply to the judge {replay}; "
    assert said + "it takes: no options" in out.stderr
    assert not (tmp_path / "v.jsonl").exists()


def test_a_plugin_judge_plugs_in_as_ours_do(plugin, examples_dir, tiny_nli, tmp_path):
    """Installed by its own distribution's entry point, the judge builds from its spec, takes
    its own options and no others, and checks traces from the command line."""
    from stepgap.teacher.judges import JUDGES, build_judge

    answer = tmp_path / "answer.json"
    first = json.loads((examples_dir / "judge_replay.jsonl").read_text().splitlines()[0])
    answer.write_text(json.dumps(first["judge"]))
    assert "echo" in JUDGES.names()
    judge = build_judge(f"echo:{answer}", copies=2)
    assert (judge.path, judge.copies) == (str(answer), 2)
    with pytest.raises(BackendOptionError, match="'echo' takes no option 'concurrency'.*copies"):
        build_judge(f"echo:{answer}", concurrency=2)

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), *sys.path])}
    out = tmp_path / "verdicts.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "stepgap.cli", "check", str(examples_dir / "traces.jsonl"),
         "-o", str(out), "--judge", f"echo:{answer}", "--nli",
         str(tiny_nli)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    verdicts = [json.loads(line) for line in out.read_text().splitlines()]
    assert verdicts and all(v["checker"]["judge"]["spec"] == f"echo:{answer}" for v in verdicts)
    assert all(v["label"] is not None for v in verdicts)


class Widget(Backend):
    def __init__(self, arg, options):
        self.arg = arg


def test_a_registry_finds_a_distribution_added_to_the_path_later(tmp_path, monkeypatch):
    registry: Registry[Widget] = Registry("widget", "stepgap.test_widgets", Widget)
    assert registry.names() == []
    site = tmp_path / "later"
    info = site / "widgets-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: widgets\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[stepgap.test_widgets]\nbox = widgets_box:Box\n")
    (site / "widgets_box.py").write_text(
        textwrap.dedent("from tests.test_registry import Widget\nclass Box(Widget):\n    pass\n")
    )
    monkeypatch.syspath_prepend(str(site))
    assert registry.names() == ["box"]
    assert registry.build("box:lid").arg == "lid"
