"""ONNX export of the NLI model: parity with PyTorch (fp32, int8), both label orders."""

from __future__ import annotations

import pytest

from stepgap.export.onnx_nli import (
    PROBE_PAIRS,
    ExportError,
    ParityError,
    check_parity,
    export_onnx,
    served_parity,
)
from stepgap.teacher import load_nli
from stepgap.teacher.nli.hf import HFNLI, NLI_LABELS
from stepgap.teacher.nli.onnx import ONNXNLI, parse_providers, resolve_providers
from stepgap.tree import nli_label


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

    # the recorded PyTorch reference, re-run on the serving provider (here the CPU)
    reference = parity.reference()
    assert len(reference["pairs"]) == parity.pairs == len(reference["probs"])
    for precision in ("fp32", "int8"):
        backend = ONNXNLI(onnx_dir, precision=precision, providers=["CPUExecutionProvider"])
        served = served_parity(backend, reference, atol=parity.atol, floor=parity.floor)
        assert served["provider"] == "CPUExecutionProvider"
        assert served["label_agreement"] >= 0.99
    assert (
        served_parity(ONNXNLI(onnx_dir), reference, atol=1e-3, floor=0.99)["max_abs_prob_diff"]
        < 1e-3
    )
    # one pair's recorded probabilities moved by 0.01: fp32 fails naming it; int8 checks labels
    moved = {**reference, "probs": [list(r) for r in reference["probs"]]}
    moved["probs"][2] = [v + (0.01 if i == 0 else -0.005) for i, v in enumerate(moved["probs"][2])]
    with pytest.raises(ParityError, match=r"ONNX fp32 on CPUExecutionProvider.*Kurosawa directed"):
        served_parity(ONNXNLI(onnx_dir), moved, atol=parity.atol, floor=parity.floor)
    # every label rotated: no precision agrees
    rotated = {**reference, "probs": [r[1:] + r[:1] for r in reference["probs"]]}
    with pytest.raises(ParityError, match=r"ONNX int8 on CPUExecutionProvider: agrees .* 0\.0%"):
        served_parity(backend, rotated, atol=parity.atol, floor=parity.floor)


def test_onnx_backend_gives_the_pytorch_probabilities_per_named_label(exported):
    source, onnx_dir = exported
    pairs = PROBE_PAIRS[:6]
    torch_probs = HFNLI(str(source), device="cpu").predict(pairs)
    for backend in (ONNXNLI(onnx_dir), load_nli(f"onnx:{onnx_dir}")):
        for a, b in zip(backend.predict(pairs), torch_probs, strict=True):
            assert a.entailment == pytest.approx(b.entailment, abs=1e-5)
            assert a.contradiction == pytest.approx(b.contradiction, abs=1e-5)
    int8 = ONNXNLI(onnx_dir, precision="int8").predict(pairs)
    # int8 moves probabilities by up to ~0.005 here: a label decided within 0.02 of a 0.5
    # threshold may flip (the parity gate's floor allows for it); every other label holds
    clear = [
        i for i, p in enumerate(torch_probs)
        if min(abs(p.entailment - 0.5), abs(p.contradiction - 0.5)) > 0.02
    ]  # fmt: skip
    assert len(clear) >= 3, [p.model_dump() for p in torch_probs]
    assert [nli_label(int8[i]) for i in clear] == [nli_label(torch_probs[i]) for i in clear]
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
    before quantization: the export loads the model itself and pre-processes. Nor what a user
    cannot act on: torch's TorchScript-exporter deprecation (optimum's choice, shown wherever
    DeprecationWarnings are: here, `-W default`, notebooks) and the quantizer's root-logger
    notes on DeBERTa's GatherElements (left float either way)."""
    import logging
    import warnings

    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        export_onnx(str(tiny_nli), tmp_path / "onnx", int8=True)
    said = capfd.readouterr().err + caplog.text + "".join(str(w.message) for w in seen)
    assert "torch_dtype" not in said and "pre-processing" not in said, said
    assert "TorchScript" not in said and "Failed to infer data type" not in said, said
    assert not (tmp_path / "onnx" / "model_prepared.onnx").exists()


def test_execution_providers_are_checked_and_parsed(exported):
    """This machine has the CPU onnxruntime: CUDA asked for explicitly is an error listing what
    is available, never ORT's silent fall-back to the CPU."""
    import onnxruntime as ort

    _, onnx_dir = exported
    assert "CUDAExecutionProvider" not in ort.get_available_providers()
    with pytest.raises(ValueError, match=r"CUDAExecutionProvider is not available.*CPUExecution"):
        ONNXNLI(onnx_dir, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(ValueError, match="unknown ONNX Runtime provider 'GPUExecutionProvider'"):
        ONNXNLI(onnx_dir, providers=["GPUExecutionProvider"])
    cpu = ONNXNLI(onnx_dir, providers=[("cpu", {"arena_extend_strategy": "kSameAsRequested"})])
    assert cpu.session.get_providers() == ["CPUExecutionProvider"] == [cpu.provider]
    # the options go to ORT as strings, by full provider name (the CPU provider keeps none)
    assert resolve_providers([("cpu", {"arena_extend_strategy": 1}), "CPUExecutionProvider"]) == [
        ("CPUExecutionProvider", {"arena_extend_strategy": "1"}),
        ("CPUExecutionProvider", {}),
    ]
    assert parse_providers(["CUDAExecutionProvider:device_id=1:use_tf32=0,cpu", "Azure"]) == [
        ("CUDAExecutionProvider", {"device_id": "1", "use_tf32": "0"}),
        "cpu",
        "Azure",
    ]
    assert parse_providers(None) is None
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_providers(["CUDAExecutionProvider:device_id"])


def test_io_binding_gives_the_plain_run_logits(exported):
    """The IO-binding path (CUDA's) bound to the CPU here: the same logits as a plain run.
    A CPU session binds nothing by default."""
    import torch

    _, onnx_dir = exported
    backend = ONNXNLI(onnx_dir, providers=["CPUExecutionProvider"])
    assert backend._bind_device is None
    plain = backend._logits(PROBE_PAIRS)
    backend._bind_device = ("cpu", 0)
    torch.testing.assert_close(backend._logits(PROBE_PAIRS), plain, rtol=0, atol=0)


def test_int8_graph_is_fused_and_quantized_per_channel(exported):
    """The shipped int8 recipe: ORT's fusions before quantization (BiasGelu, FusedMatMul in
    the graph file, not only at session load) and one weight scale per output column."""
    import onnx
    from onnx import numpy_helper

    from stepgap.teacher.nli.onnx import ONNX_FILES

    _, onnx_dir = exported
    graph = onnx.load(onnx_dir / ONNX_FILES["int8"]).graph
    ops = {node.op_type for node in graph.node}
    assert {"BiasGelu", "FusedMatMul", "DynamicQuantizeLinear", "MatMulInteger"} <= ops, ops
    assert "Erf" not in ops  # GELU's erf form is gone into BiasGelu
    weights = {t.name: t for t in graph.initializer}
    integer = [n for n in graph.node if n.op_type == "MatMulInteger"]
    assert len(integer) >= 12  # 2 layers x (Q, K, V, output, 2 FFN) at least
    for node in integer:
        weight = numpy_helper.to_array(weights[node.input[1]])
        scale = numpy_helper.to_array(weights[node.input[1].removesuffix("_quantized") + "_scale"])
        assert scale.shape == (weight.shape[1],), (node.name, scale.shape, weight.shape)
        assert weight.dtype.name == "int8" and int(abs(weight.astype(int)).max()) <= 64  # 7 bits


def test_batches_hold_pairs_of_like_token_length(exported):
    """Pairs are batched by their token count (each batch padded to its own longest), not by
    characters: single letters and digits take a token each, common words few, so batches by
    characters here would pair the two longest and two shortest in tokens."""
    _, onnx_dir = exported
    backend = ONNXNLI(onnx_dir, batch_size=2, max_length=64)
    pairs = [
        ("1 2 3 4 5 6 7 8 9 0 1 2", "A claim."),
        ("x y z w v u t s r q p o n m", "A claim."),
        ("Information and organisation.", "A claim."),
        ("The film was released in the United States.", "A claim."),
    ]
    lengths = backend._token_lengths(pairs)
    chars = [len(p) + len(h) for p, h in pairs]
    assert sorted(range(4), key=chars.__getitem__) != sorted(range(4), key=lengths.__getitem__)
    widths: list[list[int]] = []
    logits = backend._logits

    def recording(batch):
        widths.append([lengths[pairs.index(pair)] for pair in batch])
        return logits(batch)

    backend._logits = recording
    backend.predict(pairs)
    assert max(widths[0]) <= min(widths[1]), widths
    assert backend._token_lengths(pairs[:1]) == [len(backend._encode(pairs[:1])["input_ids"][0])]


def test_an_nli_model_that_cannot_be_had_is_one_clear_error(tmp_path, hub_offline):
    """`stepgap export --nli ID` with an id neither on disk nor reachable: the one-line error
    the CLI prints (a FileNotFoundError), not transformers' OSError traceback."""
    from stepgap.export.onnx_nli import export_onnx
    from stepgap.models import ModelLoadError

    with pytest.raises(ModelLoadError, match="not a local folder and not in the Hugging Face"):
        export_onnx("nobody/no-such-nli-model", tmp_path / "nli")
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        export_onnx(str(tmp_path / "missing" / "nli"), tmp_path / "nli")
