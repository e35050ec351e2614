"""The wheel installs one import name, `stepgap`, with every subpackage under it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GENERIC = {"teacher", "eval", "serving", "export", "student", "data_builders", "tests", "examples"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        check=True,
    )
    (whl,) = out.glob("stepgap-*.whl")
    return whl


def test_wheel_has_only_the_stepgap_import_name(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"stepgap"}
    for sub in (
        "teacher", "eval", "data_builders", "teacher/nli", "teacher/judges", "serving",
        "student", "export",
    ):  # fmt: skip
        assert f"stepgap/{sub}/__init__.py" in names
    assert "stepgap/student/configs/tiny.yaml" in names
    assert {"stepgap/eval/view.js", "stepgap/eval/view.css"} <= set(names)  # `stepgap view`
    card = zipfile.ZipFile(wheel).read("stepgap/export/MODEL_CARD.md").decode()
    assert card == (Path(__file__).resolve().parents[1] / "MODEL_CARD.md").read_text()


def test_installed_wheel_imports_outside_the_repo(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
    )
    assert not GENERIC & {p.name for p in target.iterdir()}
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = (
        "import stepgap.teacher, stepgap.eval, stepgap.student, stepgap.export.hub as h, "
        "stepgap.data_builders as d; assert 'stepgap' in h.TEMPLATE.read_text(); "
        "import stepgap.eval.view as v; assert 'textContent' in v._asset('view.js'); "
        "print(d.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.startswith(str(target))
