"""`push_to_hub` in a training recipe: the Trainer's own push (transformers' `create_repo` and
`upload_folder`, which commits through `HfApi.create_commit` without hf_xet), recorded at the huggingface_hub
boundary instead of reaching the network. What goes up is read at commit time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import stepgap.hub_access
from stepgap.student.recipe import load_config
from stepgap.student.trainer import train

from .conftest import TINY

TOKEN = "hf_secret_push_token_do_not_leak_0123456789"
REPO_ID = "user/stepgap-student"
# Files of a training checkpoint that only the checkpoint strategies may upload.
RESUME_STATE = {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"}


class HubRecorder:
    """Stands in for the Hub: records repos created and the files of every commit."""

    def __init__(self) -> None:
        self.repos: list[tuple[str, dict]] = []
        self.commits: list[dict] = []
        self.validated: list[dict] = []

    def create_repo(self, repo_id, **kwargs):
        from huggingface_hub import RepoUrl

        self.repos.append((repo_id, kwargs))
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def validate_yaml(self, content, **kwargs):
        """The Hub checks a card's metadata before the upload: here it must at least parse."""
        self.validated.append(yaml.safe_load(content.split("---\n")[1]))

    def create_commit(self, repo_id, operations, **kwargs):
        from huggingface_hub import CommitInfo

        files = {op.path_in_repo: Path(op.path_or_fileobj).read_bytes() for op in operations}
        self.commits.append({"repo_id": repo_id, "files": files, **kwargs})
        url = f"https://huggingface.co/{repo_id}/commit/{len(self.commits):040x}"
        return CommitInfo(commit_url=url, commit_message=kwargs.get("commit_message"),
                          commit_description="", oid=f"{len(self.commits):040x}", pr_url=None)  # fmt: skip


def _push_run(out: Path, examples_dir: Path, **keys) -> tuple[HubRecorder, dict]:
    """Two steps (one for the checkpoint strategy) of the tiny recipe with push_to_hub on, the
    Hub recorded, HF_TOKEN set."""
    import huggingface_hub

    hub = HubRecorder()
    settings = {
        "dataset": str(examples_dir / "teacher_verdicts.jsonl"),
        "output_dir": str(out),
        "max_train_examples": 4,
        "max_steps": 2,
        "per_device_train_batch_size": 2,  # two steps, one epoch: one evaluation
        "save_steps": 1,
        "save_total_limit": None,
        "logging_steps": 1,
        "push_to_hub": True,
        "hub_model_id": REPO_ID,
        **keys,
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_TOKEN", TOKEN)
        mp.setattr(stepgap.hub_access, "hub_unreachable", lambda: None)  # the recording Hub answers
        mp.setattr(
            huggingface_hub.HfApi, "create_repo", lambda api, *a, **k: hub.create_repo(*a, **k)
        )
        mp.setattr(huggingface_hub.HfApi, "_validate_yaml",
                   lambda api, *a, **k: hub.validate_yaml(*a, **k))  # fmt: skip
        mp.setattr(huggingface_hub.HfApi, "create_commit",
                   lambda api, *a, **k: hub.create_commit(*a, **k))  # fmt: skip
        # with hf_xet, upload_folder streams to the Hub's storage before it commits: recorded
        # here is the commit of huggingface_hub's single-commit path
        mp.setattr(huggingface_hub.hf_api, "is_xet_available", lambda: False)
        metrics = train(load_config(TINY, settings))
    return hub, metrics


def _front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def _assert_nothing_leaks(hub: HubRecorder, out: Path, metrics: dict, local: list[str]) -> None:
    """The token is in no uploaded file, no file under the output folder and not in the
    metrics; no uploaded file but the Trainer's pickled arguments names a path of this machine
    (training_args.bin holds output_dir as the recipe gives it: relative in the shipped ones)."""
    secret = TOKEN.encode()
    for commit in hub.commits:
        assert commit.get("token") is None  # huggingface_hub reads HF_TOKEN itself
        for name, data in commit["files"].items():
            assert secret not in data, name
            if not name.endswith("training_args.bin"):
                for path in local:
                    assert path.encode() not in data, (name, path)
    written = [p for p in out.rglob("*") if p.is_file()]
    assert written and not [p for p in written if secret in p.read_bytes()]
    assert TOKEN not in json.dumps(metrics, default=str)


@pytest.mark.slow
def test_push_at_the_end_uploads_the_adapter_and_our_card_in_one_commit(tmp_path, examples_dir):
    out = tmp_path / "run"
    hub, metrics = _push_run(out, examples_dir, hub_strategy="end", hub_private_repo=True)
    assert metrics["global_step"] == 2
    assert [(r, k["private"]) for r, k in hub.repos] == [(REPO_ID, True)]
    assert len(hub.commits) == 1  # "end": checkpoints are saved locally, never pushed
    (commit,) = hub.commits
    assert commit["repo_id"] == REPO_ID
    files = commit["files"]
    assert {"adapter_model.safetensors", "adapter_config.json", "README.md",
            "stepgap_student.json", "tokenizer_config.json"} <= set(files)  # fmt: skip
    assert not [f for f in files if f.startswith(("checkpoint-", "last-checkpoint"))]
    assert not RESUME_STATE & {Path(f).name for f in files}
    adapter_config = json.loads(files["adapter_config.json"])
    assert adapter_config["base_model_name_or_path"] == "tiny-base"  # not this machine's path
    card = files["README.md"].decode()
    meta = _front_matter(card)
    assert meta["library_name"] == "peft" and meta["license"] == "apache-2.0"
    assert {"stepgap", "trl", "sft", "lora"} <= set(meta["tags"])
    assert "base_model" not in meta  # a local base has no Hub page
    assert f"# {REPO_ID}" in card and "LoRA adapter on `tiny-base`" in card
    assert "stand-in" in card  # the tiny base says what it is
    assert "| lora_r | 64 |" in card and "| train_examples | 4 |" in card
    assert "| train_loss |" in card and "| eval_loss |" in card
    assert f"hf download {REPO_ID}" in card and "--judge student:student" in card
    assert "calibration at stage C" in card  # the method's limitations, quoted
    assert "Training in progress" not in card and "trl" in card  # ours, not TRL's draft
    _assert_nothing_leaks(hub, out, metrics, [str(tmp_path), str(examples_dir)])
    # locally the adapter still loads its base, and README.md is the same card
    local = json.loads((out / "adapter_config.json").read_text())
    assert local["base_model_name_or_path"] == str(out / "tiny-base")
    assert _front_matter((out / "README.md").read_text())["library_name"] == "peft"


@pytest.mark.slow
def test_the_checkpoint_strategy_also_pushes_the_resume_state(tmp_path, examples_dir):
    out = tmp_path / "run"
    hub, metrics = _push_run(out, examples_dir, hub_strategy="checkpoint", max_steps=1)
    assert [(r, k["private"]) for r, k in hub.repos] == [(REPO_ID, None)]
    # step 1: the adapter and the checkpoint (two commits), then the final push
    messages = [c["commit_message"] for c in hub.commits]
    assert messages == ["Training in progress, step 1", "Training in progress, step 1, checkpoint",
                        "Model save"]  # fmt: skip
    checkpoint = hub.commits[1]["files"]
    assert {f"last-checkpoint/{f}" for f in RESUME_STATE} <= set(checkpoint)
    for commit, prefix in ((hub.commits[0], ""), (checkpoint, "last-checkpoint/")):
        files = commit if prefix else commit["files"]
        config = json.loads(files[f"{prefix}adapter_config.json"])
        assert config["base_model_name_or_path"] == "tiny-base"
        assert _front_matter(files[f"{prefix}README.md"].decode())["library_name"] == "peft"
        assert "# user/stepgap-student" in files[f"{prefix}README.md"].decode()  # not peft's
    _assert_nothing_leaks(hub, out, metrics, [str(tmp_path), str(examples_dir)])


def test_push_without_a_token_fails_before_training(tmp_path, examples_dir, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    cfg = load_config(TINY, {"output_dir": str(tmp_path / "run"), "push_to_hub": True,
                             "hub_model_id": REPO_ID})  # fmt: skip
    with pytest.raises(ValueError, match=r"push_to_hub \(to user/stepgap-student\) needs a "
                       r"Hugging Face token.*HF_TOKEN"):  # fmt: skip
        train(cfg)
    assert not (tmp_path / "run").exists()
