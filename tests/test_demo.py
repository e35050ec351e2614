"""The demo (examples/demo.py) says how long a stage took on this machine, after it ran, and
never beforehand with a figure from another machine (one that was off several times under
load)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_no_stage_announces_a_duration():
    tree = ast.parse((REPO / "examples" / "demo.py").read_text())
    calls = [
        n for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "stage"
    ]  # fmt: skip
    assert len(calls) >= 9
    for call in calls:
        assert len(call.args) == 1 and not call.keywords, ast.unparse(call)


def test_each_stage_says_what_the_one_before_it_took(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("stepgap_demo", REPO / "examples" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "stepgap_demo", demo)
    spec.loader.exec_module(demo)
    now = [100.0]
    monkeypatch.setattr(demo.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(demo, "BEGAN", 100.0)
    demo.stage("1. first")
    now[0] += 75
    demo.stage("2. second")
    out = capsys.readouterr().out
    assert "== [0:00] 1. first" in out and "(that took 1:15)" in out
    assert "== [1:15] 2. second" in out and "about" not in out
