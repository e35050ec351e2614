"""A PRM in a bundle: exported to ONNX (fp32 + int8) behind a parity gate, loaded offline as a
`PRMChecker` whose parity probe is re-run, and used by `stepgap check --bundle`."""

from __future__ import annotations

import json
import shutil

import pytest

from stepgap.export import OfflineChecker
from stepgap.export.bundle import BundleError, export_bundle, read_bundle, sha256_file
from stepgap.export.offline import load_checker
from stepgap.export.push import render_card
from stepgap.schema import LABELS
from stepgap.student.prm import ONNXPRM, PRMChecker
from stepgap.teacher.build import CheckerConfig

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def prm_bundle(tiny_prm, tmp_path_factory, examples_dir):
    return export_bundle(
        str(tiny_prm), None, tmp_path_factory.mktemp("prm") / "bundle", prm_quantize="int8",
        probe_verdicts=examples_dir / "teacher_verdicts.jsonl",
    )  # fmt: skip


def test_export_writes_the_onnx_prm_with_a_prm_manifest_and_checksums(prm_bundle):
    manifest = json.loads((prm_bundle / "manifest.json").read_text())
    student = manifest["student"]
    assert student["kind"] == "prm" and "nli" not in manifest and "tree" not in manifest
    assert not (prm_bundle / "nli").exists()
    assert student["precisions"] == ["fp32", "int8"] and student["default_precision"] == "int8"
    for name in ("model.onnx", "model_quantized.onnx", "stepgap_prm.json", "config.json"):
        assert f"student/{name}" in manifest["files"]
    for rel, digest in manifest["files"].items():
        assert sha256_file(prm_bundle / rel) == digest
    parity = student["parity"]
    # the probe is the verdicts file's 10 traces, every marker inside the window
    assert parity["probe_traces"] == 10 and parity["probe_markers"] == 28
    assert parity["fp32_max_abs_prob_diff"] <= parity["atol"]
    reference = json.loads((prm_bundle / parity["reference"]).read_text())
    assert len(reference["traces"]) == 10 and len(reference["label_probs"]) == 28
    assert read_bundle(prm_bundle).kind == "prm"
    card = render_card(manifest, "user/prm")
    assert "PRM" in card and "pipeline_tag: token-classification" in card
    assert "NLI cross-encoder" not in card and "int8" in card


def test_a_manifest_without_kind_is_a_generative_students():
    from pathlib import Path

    old = Path(__file__).parent / "made_before" / "bundle"  # made before `kind` was written
    assert "kind" not in json.loads((old / "manifest.json").read_text())["student"]
    bundle = read_bundle(old)
    assert bundle.kind == "generative" and not bundle.is_prm and bundle.nli_dir is not None


def test_from_bundle_gives_a_prm_checker_on_the_bundles_precision(prm_bundle, example_traces):
    checker = OfflineChecker.from_bundle(prm_bundle)
    assert isinstance(checker, PRMChecker) and isinstance(checker.runner, ONNXPRM)
    assert checker.runner.precision == "int8" and checker.judge is None
    assert checker.prm_parity["label_agreement"] >= 0.99
    verdicts = checker.check(example_traces[:2])
    for v in (v for vs in verdicts for v in vs):
        assert v.label in LABELS and v.path and v.confidence is not None and v.judge is None
        assert v.checker["prm"]["spec"].endswith("(onnx int8)")
    fp32 = load_checker(CheckerConfig(bundle=str(prm_bundle), nli_precision="fp32"))
    assert fp32.runner.precision == "fp32"


def test_options_a_prm_bundle_does_not_take_are_refused(prm_bundle, tiny_prm):
    with pytest.raises(ValueError, match=r"--judge\) does not apply to the PRM"):
        load_checker(CheckerConfig(bundle=str(prm_bundle), judge="openai:m"))
    with pytest.raises(ValueError, match="drop --nli"):
        load_checker(CheckerConfig(bundle=str(prm_bundle), nli="hf:x"))
    with pytest.raises(ValueError, match=r"--entail-threshold\) does not apply"):
        load_checker(CheckerConfig(bundle=str(prm_bundle), entail_threshold=0.7))
    with pytest.raises(ValueError, match="is a PRM .* drop --nli, --nli-quantize"):
        export_bundle(str(tiny_prm), "hf:x", prm_bundle.parent / "x", nli_quantize="int8")


def test_loading_rechecks_parity_and_refuses_an_altered_reference(prm_bundle, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(prm_bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    rel = manifest["student"]["parity"]["reference"]
    reference = json.loads((copy / rel).read_text())
    reference["label_probs"][0] = reference["label_probs"][0][::-1]  # another label's mass
    (copy / rel).write_text(json.dumps(reference))
    manifest["files"][rel] = sha256_file(copy / rel)  # re-signed: only parity can catch it
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"ONNX fp32 PRM on CPUExecutionProvider: prob"):
        load_checker(CheckerConfig(bundle=str(copy), nli_precision="fp32"))


def test_stepgap_check_with_a_prm_bundle_writes_labelled_verdicts(prm_bundle, tmp_path, capsys):
    from stepgap.cli import main

    out = tmp_path / "v.jsonl"
    rc = main(["check", "examples/traces.jsonl", "--bundle", str(prm_bundle), "-o", str(out),
               "--no-progress"])  # fmt: skip
    assert rc == 0
    verdicts = [json.loads(x) for x in out.read_text().splitlines()]
    assert verdicts and all(v["label"] in LABELS for v in verdicts)
    assert all(len(v["path"]) == 1 and v["repair"] and v["confidence"] for v in verdicts)
