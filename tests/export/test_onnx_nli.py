"""ONNX export of the NLI model: parity with PyTorch (fp32, int8), both label orders."""

from __future__ import annotations

import pytest

from stepgap.export.onnx_nli import PROBE_PAIRS, ExportError, check_parity, export_onnx
from stepgap.teacher import load_nli
from stepgap.teacher.nli import nli_label
from stepgap.teacher.nli.hf import HFNLI, NLI_LABELS
from stepgap.teacher.nli.onnx import ONNXNLI


@pytest.fixture(scope="module", params=["moritz", "cross-encoder"])
def exported(request, tmp_path_factory, tiny_nli, tiny_nli_cross_encoder_order):
    source = tiny_nli if request.param == "moritz" else tiny_nli_cross_encoder_order
    out = export_onnx(str(source), tmp_path_factory.mktemp(f"onnx-{request.param}"), int8=True)
    return source, out


def test_fp32_and_int8_parity(exported):
    source, onnx_dir = exported
    parity = check_parity(str(source), onnx_dir, ["int8"])
    assert parity.fp32_max_abs_diff < 1e-3
    assert parity.agreement["int8"] >= 0.99
    assert parity.pairs >= len(PROBE_PAIRS)
    # agreement over a mix of labels, not one class (the stand-in spans all three here)
    assert all(parity.label_counts[c] > 0 for c in NLI_LABELS), parity.label_counts
    print("fp32 labels on the probe set:", parity.label_counts)


def test_onnx_backend_gives_the_pytorch_probabilities_per_named_label(exported):
    source, onnx_dir = exported
    pairs = PROBE_PAIRS[:6]
    torch_probs = HFNLI(str(source), device="cpu").predict(pairs)
    for backend in (ONNXNLI(onnx_dir), load_nli(f"onnx:{onnx_dir}")):
        for a, b in zip(backend.predict(pairs), torch_probs, strict=True):
            assert a.entailment == pytest.approx(b.entailment, abs=1e-5)
            assert a.contradiction == pytest.approx(b.contradiction, abs=1e-5)
    int8 = ONNXNLI(onnx_dir, precision="int8").predict(pairs)
    assert [nli_label(p) for p in int8] == [nli_label(p) for p in torch_probs]
    assert len({nli_label(p) for p in torch_probs}) >= 2  # not neutral against neutral


def test_both_label_orders_give_the_same_named_probabilities(
    tmp_path, tiny_nli, tiny_nli_cross_encoder_order
):
    a = ONNXNLI(export_onnx(str(tiny_nli), tmp_path / "a"))
    b = ONNXNLI(export_onnx(str(tiny_nli_cross_encoder_order), tmp_path / "b"))
    assert a.columns != b.columns
    for pa, pb in zip(a.predict(PROBE_PAIRS), b.predict(PROBE_PAIRS), strict=True):
        assert pa.entailment == pytest.approx(pb.entailment, abs=1e-5)
        assert pa.neutral == pytest.approx(pb.neutral, abs=1e-5)


def test_parity_fails_loudly(exported, tmp_path, tiny_nli):
    from tests.fixtures.models import build_deberta_nli

    source, onnx_dir = exported
    with pytest.raises(ExportError, match="agrees with fp32"):
        check_parity(str(source), onnx_dir, ["int8"], floor=1.01)
    other = build_deberta_nli(tmp_path / "other", seed=5, train=False)  # other weights
    with pytest.raises(ExportError, match="differ from PyTorch"):
        check_parity(str(other), onnx_dir)


def test_missing_precision_is_a_clear_error(exported):
    _, onnx_dir = exported
    with pytest.raises(FileNotFoundError, match="fp16"):
        ONNXNLI(onnx_dir, precision="fp16")
    with pytest.raises(ValueError, match="precision"):
        ONNXNLI(onnx_dir, precision="int4")


def test_the_export_prints_no_avoidable_warning(tmp_path, tiny_nli, caplog, capfd):
    """No `torch_dtype` deprecation (optimum's main_export) and no ORT request to pre-process
    before quantization: the export loads the model itself and pre-processes."""
    import logging

    with caplog.at_level(logging.WARNING):
        export_onnx(str(tiny_nli), tmp_path / "onnx", int8=True)
    said = capfd.readouterr().err + caplog.text
    assert "torch_dtype" not in said and "pre-processing" not in said, said
    assert not (tmp_path / "onnx" / "model_prepared.onnx").exists()
