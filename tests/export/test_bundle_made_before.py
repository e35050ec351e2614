"""A bundle exported before the NLI export moved from optimum-onnx to `torch.onnx.export` and
transformers 5 (stepgap 0.1.0 at commit 400e615: transformers 4.57.6, optimum-onnx 0.1.0; an
adapter bundle of the tiny recipe, int8 NLI) still loads, and checks the example traces as it
did then (`made_before/verdicts.jsonl`, written by that stepgap from that bundle).

Since then the schema constraint reads byte tokens as the bytes they are (a character split over
tokens no longer passes as one replacement character per token, as vLLM reads them too), so the
tiny student's answers changed where its old answer held such a character: those steps are not
compared. NLI batches then hold other pairs, and the int8 graph quantizes each batch's
activations with that batch's own scale, so the probabilities move by a few 1e-4."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from stepgap.cli import main
from stepgap.export.bundle import BundleError, verify_bundle

MADE_BEFORE = Path(__file__).parent / "made_before"


@pytest.fixture
def bundle(tmp_path) -> Path:
    return Path(shutil.copytree(MADE_BEFORE / "bundle", tmp_path / "bundle"))


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_bundle_made_before_gives_the_verdicts_it_gave_then(bundle, examples_dir, tmp_path):
    out = tmp_path / "verdicts.jsonl"
    assert main(["check", str(examples_dir / "traces.jsonl"), "--bundle", str(bundle),
                 "-o", str(out)]) == 0  # fmt: skip
    then, now = _read(MADE_BEFORE / "verdicts.jsonl"), _read(out)
    assert [(v["trace_id"], v["step"]) for v in now] == [(v["trace_id"], v["step"]) for v in then]
    split = [a for a in then if "\ufffd" in json.dumps(a["judge"], ensure_ascii=False)]
    assert len(split) <= len(then) // 3
    for a, b in zip(then, now, strict=True):
        if a in split:
            continue
        where = f"{a['trace_id']} step {a['step']}"
        assert (b["label"], b["path"], b["judge"]) == (a["label"], a["path"], a["judge"]), where
        assert [c["label"] for c in b["nli"]] == [c["label"] for c in a["nli"]], where
        for c, d in zip(a["nli"], b["nli"], strict=True):
            assert d["probs"] == pytest.approx(c["probs"], abs=1e-3), where


def test_a_bundle_of_another_format_names_its_version_and_what_to_do(bundle):
    manifest = bundle / "manifest.json"
    data = json.loads(manifest.read_text())
    data.update(format_version=2, stepgap_version="9.0.0")
    manifest.write_text(json.dumps(data))
    with pytest.raises(BundleError) as caught:
        verify_bundle(bundle)
    message = str(caught.value)
    assert "\n" not in message
    assert "format_version 2 (made by stepgap 9.0.0)" in message
    assert "export the bundle again with this stepgap (`stepgap export`)" in message
