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
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
        text=True,
    )
    # a user's `pip install` prints what the build backend warns: it must warn of nothing
    assert "Warning" not in build.stdout + build.stderr, build.stdout + build.stderr
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
    assert "stepgap/student/configs/accelerate/multi_gpu.yaml" in names
    assert {"stepgap/eval/view.js", "stepgap/eval/view.css"} <= set(names)  # `stepgap view`
    card = zipfile.ZipFile(wheel).read("stepgap/MODEL_CARD.md").decode()
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
        "import stepgap.eval.view_page as v; assert 'textContent' in v._asset('view.js'); "
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


def _extras() -> dict[str, list]:
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with Python 3.11+")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {
        extra: [Requirement(r) for r in reqs]
        for extra, reqs in project["optional-dependencies"].items()
    }


def _gpu_combined_extras() -> set[str]:
    """The extras README's GPU lines install together with `gpu`."""
    import re

    readme = (REPO / "README.md").read_text()
    section = readme.split("## Real models and GPUs", 1)[1].split("\n## ", 1)[0]
    combos = [set(m.split(",")) for m in re.findall(r'pip install -e "\.\[([a-z,]+)\]"', section)]
    gpu_lines = [c for c in combos if "gpu" in c]
    assert gpu_lines, "README's 'Real models and GPUs' has no pip line with the gpu extra"
    return set().union(*gpu_lines) - {"gpu"}


def test_the_gpu_extra_replaces_onnxruntime():
    """onnxruntime and onnxruntime-gpu are one Python module: the `gpu` extra installs the GPU
    build only, nothing README pairs with it pulls the CPU build back in, and optimum-onnx comes
    without its `[onnxruntime]` extra (which requires the CPU build)."""
    import importlib.metadata

    from packaging.requirements import Requirement

    extras = _extras()
    gpu = {r.name: r for r in extras["gpu"]}
    assert "onnxruntime-gpu" in gpu and "onnxruntime" not in gpu, sorted(gpu)
    assert "onnxruntime" not in gpu["optimum-onnx"].extras, str(gpu["optimum-onnx"])
    assert "onnxruntime" in {r.name for r in extras["export"]}  # the CPU runtime lives there
    combined = _gpu_combined_extras() | {"deepspeed"}
    assert {"teacher", "train", "serve"} <= combined
    for extra in combined:
        assert "onnxruntime" not in {r.name for r in extras[extra]}, extra

    # optimum-onnx pulls a runtime only through its own extras
    for line in importlib.metadata.requires("optimum-onnx") or []:
        req = Requirement(line)
        if req.name in ("onnxruntime", "onnxruntime-gpu"):
            assert req.marker is not None and not req.marker.evaluate({"extra": ""}), line
    # nor does anything installed here that those extras bring in, however deep
    seen: set[str] = set()
    todo = [r for e in (*combined, "gpu") for r in extras[e] if not r.extras]
    while todo:
        req = todo.pop()
        if req.name in seen:
            continue
        seen.add(req.name)
        try:
            requires = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed on this machine (deepspeed, onnxruntime-gpu)
        for line in requires:
            dep = Requirement(line)
            if dep.marker is None or dep.marker.evaluate({"extra": ""}):
                assert dep.name != "onnxruntime", f"{req.name} requires onnxruntime"
                todo.append(dep)


def test_readme_gpu_lines_install_the_gpu_runtime_alone():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Real models and GPUs", 1)[1].split("\n## ", 1)[0]
    assert "pip uninstall -y onnxruntime" in section
    assert "--nli-provider CUDAExecutionProvider" in section
    assert "`gpu` | the same with `onnxruntime-gpu`: use it **instead of** `export`" in readme
