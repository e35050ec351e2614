"""`stepgap push`: exactly the bundle's files and a card whose metadata parses; the Hub API is
mocked at the HfApi boundary only."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from stepgap.cli import main
from stepgap.export.bundle import export_bundle, summarize_eval_report, verify_bundle
from stepgap.export.push import plan_push, push_bundle, render_card


@pytest.fixture(scope="module")
def bundle(tiny_student, tiny_nli, tmp_path_factory, examples_dir):
    """An adapter bundle with an eval summary, plus junk that must never be uploaded."""
    adapter, _ = tiny_student
    out = tmp_path_factory.mktemp("hub") / "bundle"
    report = tmp_path_factory.mktemp("report") / "report.json"
    report.write_text(
        '{"n_steps": 28, "n_traces": 7, "checkers": {"student": {"sP": 0.9, "sR": 0.8,'
        ' "sF1": 0.847, "BA": 0.88, "kappa": 0.7, "QF1": 0.75, "healthy": true}}}'
    )
    export_bundle(str(adapter), str(tiny_nli), out, eval_summary=summarize_eval_report(report))
    (out / ".env").write_text("HF_TOKEN=hf_secret_do_not_upload\n")
    (out / "nli" / ".cache").mkdir()
    (out / "nli" / ".cache" / "x.lock").write_text("")
    (out / "notes.txt").write_text("scratch")
    return out


def _front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_dry_run_lists_exactly_the_bundle_files_and_the_card(bundle, capsys):
    manifest = verify_bundle(bundle)
    assert main(["push", str(bundle), "--repo-id", "me/stepgap-tiny", "--dry-run"]) == 0
    out = capsys.readouterr().out
    listed = out.split("\n\n----- README.md")[0].split()
    assert listed == sorted([*manifest["files"], "manifest.json", "README.md"])
    assert not any(x in out.split("-----")[0] for x in (".env", ".cache", "notes.txt"))
    card = out.split("----- README.md (model card) -----\n", 1)[1]
    meta = _front_matter(card)
    assert meta["license"] == "apache-2.0" and meta["pipeline_tag"] == "text-generation"
    assert "stepgap" in meta["tags"]
    metrics = {m["name"]: m["value"] for m in meta["model-index"][0]["results"][0]["metrics"]}
    assert metrics["sF1"] == pytest.approx(0.847) and metrics["kappa"] == pytest.approx(0.7)
    assert "base_model" not in meta  # a local base path means nothing on the Hub
    assert "hf_secret" not in out


def test_card_names_a_hub_base_model_and_fills_every_placeholder(bundle):
    manifest = verify_bundle(bundle)
    manifest["student"].update(base="Qwen/Qwen2.5-7B-Instruct", base_revision="a09a3545")
    card = render_card(manifest, "me/x")
    assert _front_matter(card)["base_model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert "at revision `a09a3545`" in card
    assert not re.search(r"\$[a-z_]+", card), "an unfilled placeholder"
    assert "| sF1 | 0.8470 |" in card
    assert "Limitations" in card and "calibration" in card


class FakeHfApi:
    """Records the calls stepgap makes at the huggingface_hub boundary."""

    def __init__(self, *args, **kwargs):
        self.calls = []

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))

    def create_branch(self, repo_id, **kwargs):
        self.calls.append(("create_branch", repo_id, kwargs))

    def create_commit(self, repo_id, operations, **kwargs):
        self.calls.append(("create_commit", repo_id, kwargs))
        self.operations = operations


def test_push_creates_the_repo_and_uploads_one_commit(bundle, monkeypatch, capsys):
    import huggingface_hub

    import stepgap.hub_access

    api = FakeHfApi()
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda *a, **k: api)
    monkeypatch.setattr(stepgap.hub_access, "hub_unreachable", lambda: None)  # the fake Hub answers
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_value")
    assert main(["push", str(bundle), "--repo-id", "me/stepgap-tiny", "--private",
                 "--revision", "v1"]) == 0  # fmt: skip
    names = [c[0] for c in api.calls]
    assert names == ["create_repo", "create_branch", "create_commit"]
    assert api.calls[0][2]["private"] is True and api.calls[2][2]["revision"] == "v1"
    paths = sorted(op.path_in_repo for op in api.operations)
    assert paths == plan_push(bundle, "me/stepgap-tiny").files
    card = next(op for op in api.operations if op.path_in_repo == "README.md")
    assert b"hf_secret" not in card.path_or_fileobj
    assert b"me/stepgap-tiny" in card.path_or_fileobj
    assert "load it anywhere with --bundle me/stepgap-tiny@v1" in capsys.readouterr().err


def test_push_refuses_a_tampered_bundle(bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    (copy / "student" / "adapter_config.json").write_text("{}")
    api = FakeHfApi()
    with pytest.raises(Exception, match="adapter_config.json"):
        push_bundle(copy, "me/x", api=api)
    assert api.calls == []


def _report(tmp_path, rows: dict) -> str:
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"n_steps": 28, "n_traces": 10, "checkers": rows}))
    return str(path)


REPLAYED = {"judge": {"spec": "replay:judge_replay.jsonl", "note": "replayed: stored answers"},
            "nli": {"spec": "replay:nli_replay.jsonl", "note": "replayed: stored answers"}}  # fmt: skip
STUDENT = {"judge": {"spec": "student:student_tiny", "note": "stand-in: a tiny random Qwen2"},
           "nli": {"spec": "hf:tiny-nli", "note": "stand-in: a tiny DebertaV2"}}  # fmt: skip


def test_the_card_takes_the_students_row_and_refuses_to_guess(tmp_path):
    row = {"sF1": 1.0, "BA": 1.0, "kappa": 1.0, "healthy": True}
    two_teachers = _report(tmp_path, {"StepGap": {**row, "provenance": [REPLAYED]},
                                      "minus-E": {**row, "provenance": [REPLAYED]}})  # fmt: skip
    with pytest.raises(ValueError, match="2 checkers .StepGap, minus-E.; name the one"):
        summarize_eval_report(two_teachers)
    assert summarize_eval_report(two_teachers, "minus-E")["checker"] == "minus-E"
    with_student = _report(
        tmp_path,
        {"StepGap": {**row, "provenance": [REPLAYED]},
         "student": {**row, "sF1": 0.4, "provenance": [STUDENT]}},
    )  # fmt: skip
    summary = summarize_eval_report(with_student)
    assert summary["checker"] == "student" and summary["metrics"]["sF1"] == 0.4
    assert any("stand-in" in n for n in summary["notes"])


def test_a_card_says_which_checker_and_when_figures_come_from_stand_ins(bundle, tmp_path):
    manifest = verify_bundle(bundle)
    manifest["eval"] = summarize_eval_report(
        _report(tmp_path, {"student": {"sF1": 1.0, "BA": 1.0, "provenance": [STUDENT]}})
    )
    card = render_card(manifest, "me/x")
    assert "The figures of checker `student`" in card
    assert "**These figures do not measure a real checker**" in card
    assert "judge student:student_tiny: stand-in: a tiny random Qwen2" in card
    # this bundle's own parts are the test stand-ins, and the card says so next to them
    assert "stand-in: a tiny random-weight Qwen2" in card and "stand-in: a tiny DebertaV2" in card
    real = {**manifest, "eval": {**manifest["eval"], "notes": []},
            "student": {**manifest["student"], "note": None}, "nli": {**manifest["nli"], "note": None}}  # fmt: skip
    assert "do not measure a real checker" not in render_card(real, "me/x")


def test_export_refuses_an_ambiguous_report_before_any_work(tiny_student, tmp_path, capsys):
    adapter, _ = tiny_student
    report = _report(tmp_path, {"a": {"provenance": [REPLAYED]}, "b": {"provenance": [REPLAYED]}})
    out = tmp_path / "bundle"
    assert main(["export", "--student", str(adapter), "--nli", "unused", "-o", str(out),
                 "--eval-report", report]) == 2  # fmt: skip
    assert "--eval-checker NAME" in capsys.readouterr().err and not out.exists()
