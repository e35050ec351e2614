"""Session-wide fixtures: tiny real-architecture models (built once), the shipped examples, and a
live fake OpenAI server that answers the example judge prompts."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from stepgap.io import read_models
from stepgap.schema import Verdict
from stepgap.segment import iter_traces
from stepgap.student.recipe import load_config
from stepgap.student.trainer import train
from tests.fixtures import models
from tests.fixtures import ray_cluster as _ray_on_loopback  # noqa: F401  before Ray is imported
from tests.fixtures.openai_server import FakeOpenAI, example_prompt_keys, stored_answers

# Property tests: a fixed search in CI (`CI` set, as `.ci/run` does), so a clone can never go red
# by chance; locally the full random search, with the example database remembering failures.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def pytest_configure(config: pytest.Config) -> None:
    """The suite sends Ctrl-C (SIGINT) to commands it starts and expects them to stop. A shell
    without job control starts a background job (`make test &`) with SIGINT ignored, and every
    process it starts inherits that, so the commands would never see it: give this process the
    default handler back, so that they start as they would from a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def hub_mode_restored() -> Iterator[None]:
    """A bundle loaded in a test switches its process offline (`export.offline.go_offline`, as it
    must for users); undone after each test, so that a later test's commands (which inherit this
    environment) are not offline by the order the tests ran in."""
    import huggingface_hub.constants

    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    before = {name: os.environ.get(name) for name in names}
    constant = huggingface_hub.constants.HF_HUB_OFFLINE
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    huggingface_hub.constants.HF_HUB_OFFLINE = constant


@pytest.fixture
def hub_offline(monkeypatch, tmp_path) -> Path:
    """HF_HUB_OFFLINE=1 and an empty Hugging Face cache, as a shell sets them before Python
    starts: huggingface_hub reads the variable once, at import, so its copy is set too (else it
    retries the network for seconds; transformers asks huggingface_hub). Yields the cache
    folder."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return tmp_path / "hf"


@pytest.fixture(scope="session")
def examples_dir() -> Path:
    return EXAMPLES


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    """Path of a tiny random Qwen2 causal LM with the real Qwen vocabulary."""
    return models.build_qwen2(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture(scope="session")
def tiny_nli(tmp_path_factory) -> Path:
    """Path of the tiny trained DebertaV2 NLI stand-in, labels in MoritzLaurer's order.

    Building it takes about 35 s. With `STEPGAP_TEST_CACHE=DIR` set (for repeated local runs,
    e.g. `tools/break_promises.py`), it is built once into DIR, keyed by the fixture code, and
    reused; CI leaves it unset and builds it fresh."""
    cache = os.environ.get("STEPGAP_TEST_CACHE")
    if not cache:
        return models.build_deberta_nli(tmp_path_factory.mktemp("tiny-nli"))
    import hashlib
    import shutil

    import transformers

    # the fixture's code and the transformers that trains and tokenizes (a new major version
    # reads the same spm.model differently)
    source = Path(models.__file__).read_bytes() + transformers.__version__.encode()
    key = hashlib.sha256(source).hexdigest()[:12]
    path = Path(cache) / f"tiny-nli-{key}"
    if not (path / "config.json").is_file():
        partial = tmp_path_factory.mktemp("tiny-nli")
        models.build_deberta_nli(partial)
        shutil.rmtree(path, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(partial, path)
    return path


@pytest.fixture(scope="session")
def tiny_nli_cross_encoder_order(tmp_path_factory, tiny_nli) -> Path:
    """The same model as `tiny_nli` with the cross-encoder label order (rows permuted)."""
    return models.build_deberta_nli(
        tmp_path_factory.mktemp("tiny-nli-ce"),
        order=models.NLI_ORDERS["cross-encoder"],
        permute_from=tiny_nli,
    )


@pytest.fixture(scope="session")
def example_traces(examples_dir):
    return list(iter_traces(examples_dir / "traces.jsonl"))


@pytest.fixture(scope="session")
def example_prompts(example_traces) -> dict[tuple[str, int], str]:
    """(trace id, step) -> prompt key of the judge request the checker sends for it."""
    return example_prompt_keys(example_traces)


@pytest.fixture(scope="session")
def example_answers(example_prompts, examples_dir) -> dict[str, dict]:
    """Prompt key -> the stored judge object for that step (examples/judge_replay.jsonl)."""
    return stored_answers(example_prompts, examples_dir / "judge_replay.jsonl")


@pytest.fixture(scope="session")
def pool(examples_dir) -> list[Verdict]:
    return [v for _, v in read_models(examples_dir / "teacher_verdicts.jsonl", Verdict)]


@pytest.fixture(scope="session")
def tiny_student(tmp_path_factory, examples_dir) -> tuple[Path, dict]:
    """The tiny recipe exactly as shipped (21 steps of 7 traces, 3 traces held out, 100 optimiser
    steps), in a temp folder."""
    out = tmp_path_factory.mktemp("tiny-student")
    cfg = load_config(
        REPO / "student" / "configs" / "tiny.yaml",
        {"output_dir": str(out), "dataset": str(examples_dir / "teacher_verdicts.jsonl")},
    )
    return out, train(cfg)


@pytest.fixture(scope="session")
def tiny_prm(tmp_path_factory, pool) -> Path:
    """A tiny random-weight PRM folder (`student/prm.py`'s `tiny_prm_base`, its format written),
    untrained: for what needs a PRM's shape, not its labels (export, loading, serving)."""
    from stepgap.student.mining import pool_traces
    from stepgap.student.prm import PRMFormat, step_text, tiny_prm_base

    traces = pool_traces(pool)
    texts = [t.question for t in traces] + [
        " ".join(step_text(s)) for t in traces for s in t.steps or []
    ]
    path = tiny_prm_base(tmp_path_factory.mktemp("tiny-prm"), texts)
    PRMFormat().write(path)
    return path


@pytest.fixture(scope="session")
def tiny_prm_trained(tmp_path_factory, examples_dir) -> tuple[Path, dict]:
    """The prm-tiny recipe exactly as shipped (the teacher's labels and stages at the 21 steps of
    7 traces, 3 traces held out, 100 optimiser steps, seconds on a CPU), trained once in this
    process: (the PRM folder, the metrics)."""
    out = tmp_path_factory.mktemp("tiny-prm-trained")
    cfg = load_config(
        REPO / "student" / "configs" / "prm-tiny.yaml",
        {"output_dir": str(out), "dataset": str(examples_dir / "teacher_verdicts.jsonl")},
    )
    return out, train(cfg)


@pytest.fixture(scope="session")
def prm_launched(tmp_path_factory) -> tuple[Path, Any]:
    """The prm-tiny recipe as its file says users run it, `accelerate launch student/train.py`
    from the repository root, once: (the PRM folder, the finished process)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("prm-launched") / "prm"
    cmd = [
        str(Path(sys.executable).parent / "accelerate"), "launch", "--num_machines", "1",
        "--dynamo_backend", "no", "--num_processes", "1", "--mixed_precision", "no",
        "student/train.py", "--config", "student/configs/prm-tiny.yaml", "--output_dir", str(out),
    ]  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


@pytest.fixture
def fake_openai(example_answers) -> Iterator[FakeOpenAI]:
    server = FakeOpenAI(answers=dict(example_answers)).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """One local two-node Ray cluster for the whole session (`tests/fixtures/ray_cluster.py`),
    started by the first test that asks for it."""
    from tests.fixtures.ray_cluster import two_node_cluster

    with two_node_cluster() as cluster:
        yield cluster


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests on the session's Ray cluster run last (otherwise in their order): once started,
    its processes (raylets, GCS, agents, Serve's controller) share the two cores with every
    later test, and the load and deadline tests measure a server beside them."""
    items.sort(key=lambda item: "ray_cluster" in getattr(item, "fixturenames", ()))
