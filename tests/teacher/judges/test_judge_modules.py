"""A judge of stepgap's own is one module of `teacher/judges` and one page of `docs/judges`: the
registry finds the module, its options class becomes flags of every checker command, the judges'
index links its page; and a judge request carries its step as data beside its prompt."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from stepgap.options import Options, bases_of, option
from stepgap.registry import Backend, Registry, flag, resolve

REPO = Path(__file__).resolve().parents[3]
DOCS = REPO / "docs" / "judges"


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_judge_has_its_page_and_its_options_are_flags_of_check():
    """Whatever judges there are: each has a page whose title names its spec, a row in the
    judges' index (as the generator writes it), and each field of its options class is a flag
    of `stepgap check --help`."""
    import stepgap.student.judge  # noqa: F401 - registers `student:`
    from stepgap.cli import commands
    from stepgap.teacher.judges import JUDGES

    own = JUDGES.own()
    assert {"openai", "hf", "replay", "student"} <= set(own)
    shown = commands()["check"].make_parser().format_help()
    index = (DOCS / "index.md").read_text()
    assert index == _tool("gen_cli_reference").judges_page(), "run tools/gen_cli_reference.py"
    for kind, entry in own.items():
        page = DOCS / f"{kind}.md"
        assert page.read_text().startswith(f"# `{kind}:"), kind
        assert f"]({kind}.md)" in index, kind
        for name in resolve(entry).options_class.names():
            assert re.search(rf"{re.escape(flag(name))}\b", shown), (kind, name)


CONSTANT = """
from __future__ import annotations

from dataclasses import dataclass

from stepgap.options import Options, option
from stepgap.schema import Judge
from stepgap.tree import JudgeResult

from .base import JUDGE_GROUP, JudgeBackend


@dataclass(frozen=True)
class ConstantJudgeOptions(Options):
    constant_mismatch: bool = option(False, "constant judge: stage C mismatch", group=JUDGE_GROUP)


class ConstantJudge(JudgeBackend):
    name = "constant"
    options_class = ConstantJudgeOptions

    def __init__(self, arg, options):
        self.mismatch = options.constant_mismatch

    def judge(self, requests, *, stop=None):
        return [JudgeResult(judge=self.answer(r.step_data)) for r in requests]

    def answer(self, data):
        quote = " ".join(data.step.evidence[0].text.split()[:6]) if data.step.evidence else ""
        return Judge.model_validate({
            "step_minus1_alignment": {"is_off_target": False, "alignment_reasoning": "",
                                      "drift_type": "none"},
            "step_0_abstention_check": {"is_abstention_step": False, "abstention_reasoning": "",
                                        "abstention_is_accurate": False},
            "step_1_quote_search": {"entity_match": not self.mismatch, "entity_match_reasoning": "",
                                    "found_quote": bool(quote), "evidence_quote": quote,
                                    "quote_search_reasoning": ""},
        })
"""


@pytest.fixture
def layout(tmp_path) -> Path:
    """The package as installed, in a folder of its own that a test may add modules to."""
    return _tool("lint_imports").installed_layout(tmp_path / "layout")


def _run(layout: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Python with the layout's package: `-m stepgap.cli ...` or `-c CODE ...`."""
    env = {"PYTHONPATH": str(layout), "PATH": "/usr/bin:/bin", "COLUMNS": "100"}
    return subprocess.run(
        [sys.executable, *argv],
        cwd=layout, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_judge_module_dropped_in_is_a_judge_with_its_flags(layout, tmp_path):
    """One new file in teacher/judges: its kind is a spec, its option a flag of `check` that
    reaches it, refused with another judge; its answers read the step from the request's data,
    not from the prompt."""
    (layout / "stepgap" / "teacher" / "judges" / "constant.py").write_text(CONSTANT)
    helped = _run(layout, "-m", "stepgap.cli", "check", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "--constant-mismatch" in helped.stdout and "constant judge: stage C" in helped.stdout
    ex = REPO / "examples"
    out = tmp_path / "v.jsonl"
    done = _run(layout, "-m", "stepgap.cli", "check", str(ex / "traces.jsonl"), "-o", str(out),
                "--judge", "constant:x", "--nli", f"replay:{ex / 'nli_replay.jsonl'}",
                "--constant-mismatch")  # fmt: skip
    assert done.returncode == 0, done.stderr
    verdicts = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(verdicts) == 28 and {v["label"] for v in verdicts} == {"IE"}
    assert {v["path"][-1] for v in verdicts} == {"stageC:entity_mismatch"}
    refused = _run(layout, "-m", "stepgap.cli", "check", str(ex / "traces.jsonl"), "-o",
                   str(tmp_path / "r.jsonl"), "--judge", f"replay:{ex / 'judge_replay.jsonl'}",
                   "--nli", f"replay:{ex / 'nli_replay.jsonl'}", "--constant-mismatch")  # fmt: skip
    assert refused.returncode == 2
    assert "option constant_mismatch (--constant-mismatch) does not apply" in refused.stderr
    quoted = _run(layout, "-c", QUOTES, str(ex / "traces.jsonl"))
    assert quoted.returncode == 0, quoted.stderr
    assert quoted.stdout.split() == ["quoted"] * 28


# Each answer's quote is the start of its step's first snippet (none without evidence).
QUOTES = """
import sys
from stepgap.segment import iter_traces
from stepgap.teacher.judges import build_judge
from stepgap.teacher.prompt import build_requests
judge = build_judge("constant:x")
for t in iter_traces(sys.argv[1]):
    requests = build_requests(t.id, t.question, t.steps)
    for r, result in zip(requests, judge.judge(requests)):
        quote, evidence = result.judge.step_1_quote_search.evidence_quote, r.step_data.step.evidence
        wanted = " ".join(evidence[0].text.split()[:6]) if evidence else ""
        print("quoted" if quote == wanted and (quote or not evidence) else "wrong")
"""


def test_a_judge_option_that_another_judge_declares_otherwise_fails_at_import(layout):
    clash = CONSTANT.replace(
        'constant_mismatch: bool = option(False, "constant judge: stage C mismatch", '
        "group=JUDGE_GROUP)",
        'concurrency: int = option(3, "constant judge: in flight", group=JUDGE_GROUP)',
    ).replace("options.constant_mismatch", "False")
    (layout / "stepgap" / "teacher" / "judges" / "constant.py").write_text(clash)
    done = _run(layout, "-m", "stepgap.cli", "check", "--help")
    assert done.returncode != 0
    said = done.stderr.strip().splitlines()[-1]
    assert "option 'concurrency' is declared twice, differently" in said
    assert "ConstantJudgeOptions.concurrency: int = 3" in said
    assert "OpenAIJudgeOptions.concurrency: int = 8" in said


@dataclass(frozen=True)
class _Base(Options):
    level: int = option(1, "")


@dataclass(frozen=True)
class _Derived(_Base):
    more: str = option("a", "")


@dataclass(frozen=True)
class _Same(Options):
    level: int = option(1, "")


@dataclass(frozen=True)
class _Other(Options):
    level: int = option(2, "")


def test_bases_of_keeps_each_class_once_and_refuses_a_field_declared_otherwise():
    assert bases_of(_Base, Options, _Derived, _Same, _Derived) == (_Derived, _Same)
    with pytest.raises(
        TypeError, match=r"'level'.*_Same.level: int = 1 and .*_Other.level: int = 2"
    ):
        bases_of(_Same, _Other)


def test_a_registry_imports_only_the_modules_that_name_a_backend(tmp_path, monkeypatch):
    """A helper module of the package is never imported to find the backends (one that would
    fail here); a subclass without a `name` of its own is no kind; two of one kind: an error."""
    package = tmp_path / "gadgets"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text("raise ImportError('a helper is never imported')\n")
    (package / "box.py").write_text(textwrap.dedent('''
        from tests.teacher.judges.test_judge_modules import Gadget, _Base
        class Box(Gadget):
            name = "box"
            options_class = _Base
        class BigBox(Box):
            pass
    '''))  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    registry: Registry[Gadget] = Registry(
        "gadget", "stepgap.test_gadgets", Gadget, package="gadgets"
    )
    assert list(registry.builtins()) == ["box"]
    assert registry.options_classes() == (_Base,)
    assert registry.build("box:x").arg == "x"
    (package / "crate.py").write_text(
        "from gadgets.box import Box\nclass Crate(Box):\n    name = 'box'\n"
    )
    with pytest.raises(TypeError, match="two gadget backends of kind 'box': gadgets.box.Box and "
                       "gadgets.crate.Crate"):  # fmt: skip
        Registry("gadget", "stepgap.test_gadgets", Gadget, package="gadgets").builtins()


class Gadget(Backend):
    name = "gadget"

    def __init__(self, arg, options):
        self.arg = arg


def test_a_request_carries_its_step_as_the_prompt_shows_it_and_keeps_its_cache_key():
    from stepgap.segment import segment_response
    from stepgap.teacher.judges.cache import cache_key
    from stepgap.teacher.prompt import build_requests
    from tests.teacher.test_prompt import RESPONSE, Q

    steps = segment_response(RESPONSE)
    requests = build_requests("t", Q, steps)
    assert len(requests) == len(steps) > 3
    for i, r in enumerate(requests):
        data = r.step_data
        shown = json.loads(
            re.search(r"<step_data>\n(.*)\n</step_data>", r.messages[1]["content"], re.S).group(1)
        )
        assert data.question == shown["question"] == Q
        assert data.step is steps[i] and data.earlier == steps[:i]
        assert (
            data.step.claim == shown["step"]["claim"] and data.step.query == shown["step"]["query"]
        )
        assert [s.text for s in data.step.evidence] == [e["text"] for e in shown["evidence"]]
        assert [s.claim for s in data.earlier][-3:] == shown["previous_claims"]
        bare = dataclasses.replace(r, step_data=None)
        assert r == bare
        assert cache_key("b", "m", "v", {}, r) == cache_key("b", "m", "v", {}, bare)
