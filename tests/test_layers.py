"""The layer contracts of pyproject.toml (docs/architecture.md): kept by the code, and broken by
an upward import or by a module that no layer names."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("lint_imports", REPO / "tools" / "lint_imports.py")
lint_imports = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lint_imports)


@pytest.fixture()
def layout(tmp_path: Path) -> Path:
    return lint_imports.installed_layout(tmp_path)


def test_the_layout_holds_every_module_of_every_folder(layout):
    for folder in ("stepgap", "teacher", "teacher/judges", "teacher/nli", "data_builders", "eval",
                   "student", "export", "serving", "stepgap/cli"):  # fmt: skip
        package = "stepgap" if folder == "stepgap" else "stepgap/" + folder.removeprefix("stepgap/")
        names = sorted(p.name for p in (REPO / folder).glob("*.py"))
        assert names and names == sorted(p.name for p in (layout / package).glob("*.py")), folder


def test_the_code_keeps_the_layer_contracts(layout):
    result = lint_imports.lint(layout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_an_upward_import_from_the_root_layer_breaks_them(layout):
    tree = layout / "stepgap" / "tree.py"
    tree.write_text(tree.read_text() + "\nfrom stepgap.teacher.checker import Checker\n")
    result = lint_imports.lint(layout)
    assert result.returncode == 1
    assert "stepgap.tree -> stepgap.teacher.checker" in result.stdout


def test_a_cycle_between_two_folders_breaks_them(layout):
    """The cycle this layering removed: the reward worker's configuration read by the CLI's flags."""
    worker = layout / "stepgap" / "serving" / "process_reward.py"
    worker.write_text(worker.read_text() + "\nfrom stepgap.cli.options import checker\n")
    result = lint_imports.lint(layout)
    assert result.returncode == 1
    assert "stepgap.serving.process_reward -> stepgap.cli.options" in result.stdout


def test_a_module_no_layer_names_breaks_them(layout):
    (layout / "stepgap" / "helpers.py").write_text("X = 1\n")
    result = lint_imports.lint(layout)
    assert result.returncode == 1
    assert "stepgap.helpers" in result.stdout


def test_no_two_modules_import_each_other(layout):
    assert lint_imports.mutual_imports(layout) == []


def test_a_module_importing_one_that_imports_it_is_a_circle(layout):
    """The circle broken here: student/judge.py holds the key both mining and the trainer read."""
    trainer = layout / "stepgap" / "student" / "trainer.py"
    trainer.write_text(trainer.read_text() + "\n\ndef _again():\n    from .mining import mine\n")
    assert lint_imports.mutual_imports(layout) == [
        "stepgap.student.mining <-> stepgap.student.trainer"
    ]
