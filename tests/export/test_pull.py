"""A pushed bundle loads back by its Hub id (`export/pull.py`): `stepgap push` through the `HfApi`
boundary (as in test_push.py), the pushed commit laid out as huggingface_hub's cache holds it,
and the real `snapshot_download` reading it with the Hub off. The verdicts are the folder's and
their provenance names the commit; a tampered cached file and a missing revision are one line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from stepgap.cli import main
from stepgap.export import OfflineChecker
from stepgap.export.bundle import BundleError, export_bundle
from stepgap.export.push import push_bundle
from tests.export.test_bundle import _same_verdicts
from tests.export.test_push import FakeHfApi

REPO_ID = "me/stepgap-tiny"


def lay_out_cache(cache: Path, repo_id: str, operations, revision: str) -> str:
    """One pushed commit as huggingface_hub's cache holds it: each file a blob named by its
    content, the commit's snapshot linking to them, and the revision's ref naming the commit.
    Returns the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    files = {}
    for op in operations:
        data = op.path_or_fileobj
        files[op.path_in_repo] = data if isinstance(data, bytes) else Path(data).read_bytes()
    listing = json.dumps({p: hashlib.sha256(b).hexdigest() for p, b in sorted(files.items())})
    commit = hashlib.sha1(listing.encode()).hexdigest()
    for path, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return commit


@pytest.fixture(scope="module")
def bundle(tiny_student, tiny_nli, tmp_path_factory) -> Path:
    adapter, _ = tiny_student
    return export_bundle(str(adapter), str(tiny_nli), tmp_path_factory.mktemp("pull") / "bundle")


@pytest.fixture(scope="module")
def pushed(bundle, tmp_path_factory) -> tuple[Path, str]:
    """The bundle pushed by stepgap as branch v1, and that commit in a Hugging Face cache:
    (the cache folder, the commit)."""
    api = FakeHfApi()
    push_bundle(bundle, REPO_ID, revision="v1", api=api)
    cache = tmp_path_factory.mktemp("hf-cache")
    return cache, lay_out_cache(cache, REPO_ID, api.operations, "v1")


def use_cache(monkeypatch, cache: Path, offline: bool = True) -> None:
    """This process's Hub client on `cache`, with the Hub off (`HF_HUB_OFFLINE`)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")


def checked(checker, traces) -> list:
    return [v for vs in checker.check(traces) for v in vs]


def test_a_pushed_bundle_loads_by_its_id_and_checks_as_its_folder(
    bundle, pushed, monkeypatch, example_traces, caplog
):
    cache, commit = pushed
    use_cache(monkeypatch, cache)
    with caplog.at_level("INFO", logger="stepgap.export.pull"):
        by_id = OfflineChecker.from_pretrained(REPO_ID, revision="v1")
    assert f"revision v1, commit {commit}" in caplog.text
    from_folder = checked(OfflineChecker.from_bundle(bundle), example_traces)
    from_hub = checked(by_id, example_traces)
    _same_verdicts(from_hub, from_folder)
    origin = {"repo_id": REPO_ID, "revision": "v1", "commit": commit}
    assert all(v.checker["bundle"] == origin for v in from_hub)
    assert not any("bundle" in v.checker for v in from_folder)


def test_check_and_the_trl_reward_take_the_id(
    bundle, pushed, monkeypatch, examples_dir, example_traces, tmp_path
):
    from stepgap.io import read_models
    from stepgap.schema import Verdict
    from stepgap.serving import StepGapReward, process_reward
    from stepgap.serving.trl import stepgap_reward_func

    cache, commit = pushed
    use_cache(monkeypatch, cache)
    out = tmp_path / "v.jsonl"
    assert main(["check", str(examples_dir / "traces.jsonl"), "--bundle", f"{REPO_ID}@v1",
                 "--no-progress", "-o", str(out)]) == 0  # fmt: skip
    assert {v.checker["bundle"]["commit"] for _, v in read_models(out, Verdict)} == {commit}
    config = tmp_path / "reward.json"
    config.write_text(json.dumps({"bundle": f"{REPO_ID}@v1", "no_cache": True}))
    process_reward.reset()
    try:
        reward_func = stepgap_reward_func(process_reward.get_reward({"config": str(config)}))
        got = reward_func(
            [t.question for t in example_traces],
            [t.response for t in example_traces],
            question=[t.question for t in example_traces],
            golden_answers=[t.golden_answers for t in example_traces],
        )
    finally:
        process_reward.reset()
    expected = StepGapReward(OfflineChecker.from_bundle(bundle)).score_traces(example_traces)
    assert got == pytest.approx([r.reward for r in expected])


@pytest.mark.slow
def test_serve_takes_the_id(bundle, pushed, example_traces, tmp_path):
    import httpx

    from stepgap.serving import StepGapReward
    from tests.fixtures.live_server import StepgapServe

    cache, commit = pushed
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    body = {
        "responses": [t.response for t in example_traces],
        "questions": [t.question for t in example_traces],
        "golden_answers": [t.golden_answers for t in example_traces],
    }
    with StepgapServe(["--bundle", f"{REPO_ID}@v1"], tmp_path / "serve.log", env) as server:
        got = httpx.post(f"{server.url}/reward", json=body, timeout=300).json()
        one = {"traces": [example_traces[0].model_dump(mode="json")]}
        verdicts = httpx.post(f"{server.url}/check", json=one, timeout=300).json()["verdicts"]
    expected = StepGapReward(OfflineChecker.from_bundle(bundle)).score_traces(example_traces)
    assert got["rewards"] == pytest.approx([r.reward for r in expected])
    assert verdicts[0][0]["checker"]["bundle"]["commit"] == commit


def test_a_tampered_cached_file_is_named(pushed, monkeypatch, tmp_path):
    cache, commit = pushed
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy, symlinks=True)
    snapshot = copy / f"models--{REPO_ID.replace('/', '--')}" / "snapshots" / commit
    blob = (snapshot / "nli" / "config.json").resolve()
    blob.write_bytes(blob.read_bytes().replace(b"{", b"{ ", 1))
    use_cache(monkeypatch, copy)
    with pytest.raises(BundleError, match=r"nli/config\.json: sha256 does not match"):
        OfflineChecker.from_bundle(f"{REPO_ID}@v1")


def test_a_missing_revision_or_id_is_one_line(pushed, monkeypatch, examples_dir, tmp_path, capsys):
    cache, _ = pushed
    use_cache(monkeypatch, cache)
    out = tmp_path / "v.jsonl"
    traces = str(examples_dir / "traces.jsonl")
    assert main(["check", traces, "--bundle", f"{REPO_ID}@v9", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{REPO_ID}@v9 is not in the Hugging Face cache (HF_HUB_OFFLINE is set)" in err
    # with the Hub on but out of reach, the cache alone is read at once, and the line says why
    import stepgap.hub_access

    use_cache(monkeypatch, cache, offline=False)
    monkeypatch.setattr(stepgap.hub_access, "hub_unreachable", lambda: "no route to host")
    with pytest.raises(BundleError, match="the Hub cannot be reached: no route to host"):
        OfflineChecker.from_bundle("me/never-pushed")
    assert OfflineChecker.from_bundle(f"{REPO_ID}@v1").origin["revision"] == "v1"


def test_a_folder_of_the_same_name_wins(bundle, pushed, monkeypatch, tmp_path):
    cache, _ = pushed
    use_cache(monkeypatch, cache)
    monkeypatch.chdir(tmp_path)
    shutil.copytree(bundle, tmp_path / REPO_ID)
    assert OfflineChecker.from_bundle(REPO_ID).origin is None
    assert OfflineChecker.from_pretrained(REPO_ID, revision="v1").origin is None
    with pytest.raises(BundleError, match="no such folder"):
        OfflineChecker.from_bundle("./me/other")  # a path, never an id
