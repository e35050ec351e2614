"""The NLI model to ONNX (`torch.onnx.export`), its int8 and fp16 variants, and a parity check.

Parity is checked before anything is written to a bundle: the fp32 graph must give the
PyTorch logits within `atol` on a probe set, and each reduced-precision graph must agree with
fp32 on the label of at least `floor` of the probe pairs. The PyTorch probabilities of the probe
pairs travel in the bundle, so loading re-checks them on the provider and precision that will
serve (`served_parity`): a CUDA kernel or a runtime build the export never ran is caught there.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepgap.teacher.nli.hf import NLI_LABELS
from stepgap.teacher.nli.onnx import ONNX_FILES, ONNXNLI
from stepgap.tree import Pair

log = logging.getLogger(__name__)

OPSET = 18

# Pairs that exercise entailment, contradiction, neutrality, long premises and truncation;
# the export adds the user's own (e.g. evidence/claim pairs of the example traces).
PROBE_PAIRS: list[Pair] = [
    ("A cat is an animal.", "A cat is an animal."),
    ("A cat is an animal.", "A cat is not an animal."),
    ("Rashomon is a 1950 film directed by Akira Kurosawa.", "Kurosawa directed Rashomon."),
    ("Rashomon is a 1950 film directed by Akira Kurosawa.", "Rashomon was released in 1970."),
    ("Akira Kurosawa was born in Shinagawa, Tokyo.", "Kurosawa was born in Tokyo."),
    ("The Eiffel Tower is in Paris.", "The answer is Berlin."),
    ("Whiplash is a 2014 film by Damien Chazelle. " * 40, "Chazelle directed Whiplash."),
    ("Air North is Yukon's airline.", "The airport handled 294,000 passengers in 2012."),
    ("", "An empty premise supports nothing."),
    ("Marie Curie won two Nobel Prizes.", "Marie Curie won a Nobel Prize."),
]


class ExportError(RuntimeError):
    """The export would produce a model that does not match its source."""


class ParityError(RuntimeError):
    """The ONNX model, as loaded here, does not give the probabilities recorded at export."""


@dataclass
class Parity:
    pairs: int
    fp32_max_abs_diff: float
    agreement: dict[str, float] = field(default_factory=dict)  # precision -> label agreement
    # fp32 labels on the probe set: agreement over one class only would say little
    label_counts: dict[str, int] = field(default_factory=dict)
    atol: float = 1e-3
    floor: float = 0.99
    # the probe pairs and their fp32 PyTorch probabilities (NLI_LABELS order): the reference
    # that loading checks the serving provider against
    probe: list[Pair] = field(default_factory=list)
    reference_probs: list[list[float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "probe_pairs": self.pairs,
            "fp32_max_abs_logit_diff": self.fp32_max_abs_diff,
            "label_agreement_with_fp32": self.agreement,
            "fp32_label_counts": self.label_counts,
            "atol": self.atol,
            "floor": self.floor,
        }

    def reference(self) -> dict[str, object]:
        """The probe set with its PyTorch probabilities, as a bundle stores it."""
        return {
            "labels": list(NLI_LABELS),
            "pairs": [list(p) for p in self.probe],
            "probs": self.reference_probs,
        }


class _DropUnquantizedNotes(logging.Filter):
    """onnxruntime's quantizer notes, on the root logger, each tensor whose type it cannot infer
    (DeBERTa's GatherElements in attention): such a tensor stays float, as it would anyway."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to infer data type of tensor")


@contextlib.contextmanager
def _without_exporter_notes():
    """Hide what the exporters print that a user cannot act on: torch's deprecation notes on its
    TorchScript exporter (the one that follows DeBERTa's relative attention with dynamic axes;
    shown by `-W default` or a notebook) and the quantizer's notes above."""
    drop, root = _DropUnquantizedNotes(), logging.getLogger()
    root.addFilter(drop)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.onnx")
            yield
    finally:
        root.removeFilter(drop)


# The graph's inputs, in the order the exporter passes them: what the ONNX backend feeds
# (those the tokenizer gives and the graph takes). DeBERTa-v3 (type_vocab_size 0) has no
# token types.
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _input_names(config: Any) -> list[str]:
    takes_types = getattr(config, "type_vocab_size", 0) > 0
    return [n for n in INPUTS if n != "token_type_ids" or takes_types]


def export_onnx(model: str, out_dir: str | Path, *, int8: bool = False, fp16: bool = False) -> Path:
    """Write model.onnx (+ model_quantized.onnx, model_fp16.onnx), tokenizer and config.

    The graph (`torch.onnx.export`, TorchScript tracing at opset OPSET) takes `input_ids`,
    `attention_mask` (and `token_type_ids` where the model has token types), each of shape
    (batch, sequence), and gives `logits` (batch, labels): the layout bundles have always had.
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from stepgap.models import explain_load_errors, resolve_model_ref

    model = resolve_model_ref(model)  # a folder here, or a hub id it can reach: one clear line
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with explain_load_errors(model, "NLI model"):
        source = AutoModelForSequenceClassification.from_pretrained(
            model, dtype=torch.float32
        ).eval()
    with explain_load_errors(model, "tokenizer"):
        tokenizer = AutoTokenizer.from_pretrained(model)
    names = _input_names(source.config)
    # two pairs of unequal length: padding, so the traced graph keeps the attention mask's path
    sample = tokenizer(
        ["A cat is an animal.", "Rashomon is a 1950 film directed by Akira Kurosawa."],
        ["A cat is not an animal.", "Kurosawa directed it."],
        padding=True, return_tensors="pt",
    )  # fmt: skip
    axes = {n: {0: "batch_size", 1: "sequence_length"} for n in names}
    with _without_exporter_notes(), torch.no_grad():
        torch.onnx.export(
            _logits_only(source, names),
            tuple(sample[n] for n in names),
            str(out / ONNX_FILES["fp32"]),
            input_names=names,
            output_names=["logits"],
            dynamic_axes={**axes, "logits": {0: "batch_size"}},
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    source.config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if int8:
        quantize_int8(out / ONNX_FILES["fp32"], out / ONNX_FILES["int8"])
    if fp16:
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        graph = convert_float_to_float16(onnx.load(out / ONNX_FILES["fp32"]), keep_io_types=True)
        onnx.save(graph, out / ONNX_FILES["fp16"])
    return out


def _logits_only(model: Any, names: Sequence[str]) -> Any:
    """`model` as a module of positional tensors (in `names` order) that returns the logits."""
    import torch

    class LogitsOnly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return self.model(**dict(zip(names, tensors, strict=True))).logits

    return LogitsOnly()


@dataclass(frozen=True)
class Int8Recipe:
    """How the int8 graph is made from the fp32 one (`quantize_int8`)."""

    # ORT's transformer fusions (opt level 2: BiasGelu, FusedMatMul, ...) first, so that
    # quantization sees the fused graph; DeBERTa's disentangled attention has no fused kernel
    fuse: bool = True
    # one scale per output column of each weight rather than one per tensor
    per_channel: bool = True
    # 7-bit weights: no u8 x s8 overflow on CPUs without VNNI (AVX2's vpmaddubsw saturates)
    reduce_range: bool = True
    weight_type: str = "QInt8"  # or QUInt8 (onnxruntime.quantization.QuantType names)


INT8_SHIPPED = Int8Recipe()
# The int8 graph exported before 2026-11-23: per-tensor QInt8 weights on the unfused graph.
INT8_PLAIN = Int8Recipe(fuse=False, per_channel=False, reduce_range=False)


def quantize_int8(fp32: Path, out: Path, recipe: Int8Recipe = INT8_SHIPPED) -> Path:
    """Dynamic int8 (weights int8 ahead of time, activations per batch) of the fp32 graph's
    weights (MatMul, and the word embeddings' Gather), as `recipe` says. Fused graphs hold
    ORT-only ops (com.microsoft domain), so the quantizer is told their outputs are float."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = out.with_name(out.stem + "_prepared.onnx")
    work = out.with_name(out.stem + "_fused.onnx")
    try:
        if recipe.fuse:
            from onnxruntime.transformers.optimizer import optimize_model

            # ORT's C++ fusions only: the Python passes (model_type "bert") find nothing to fuse
            # in DeBERTa's attention and ran out of memory (20 GB) on the base-size graph
            fused = optimize_model(
                str(fp32), model_type="bert", opt_level=2, use_gpu=False, only_onnxruntime=True
            )
            fused.save_model_to_file(str(work))
        # ORT's pre-processing (basic graph optimisation unless fused already, ONNX shape
        # inference; its symbolic shape inference cannot follow DeBERTa's relative positions)
        quant_pre_process(
            work if recipe.fuse else fp32,
            prepared,
            skip_optimization=recipe.fuse,
            skip_symbolic_shape=True,
        )
        with _without_exporter_notes():
            quantize_dynamic(
                prepared,
                out,
                per_channel=recipe.per_channel,
                reduce_range=recipe.reduce_range,
                weight_type=QuantType[recipe.weight_type],
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
    finally:
        prepared.unlink(missing_ok=True)
        work.unlink(missing_ok=True)
    return out


def check_parity(
    torch_model: str,
    onnx_dir: str | Path,
    precisions: Sequence[str] = (),
    *,
    probe: Sequence[Pair] = (),
    atol: float = 1e-3,
    floor: float = 0.99,
) -> Parity:
    """Compare PyTorch and ONNX on the probe set; raise ExportError when out of bounds."""
    import torch

    from stepgap.teacher.nli.hf import HFNLI

    pairs = list(dict.fromkeys([*PROBE_PAIRS, *probe]))
    reference = HFNLI(torch_model, device="cpu", dtype="float32")
    expected = torch.cat([reference._logits(pairs[i : i + 16]) for i in range(0, len(pairs), 16)])

    def logits(precision: str) -> torch.Tensor:
        backend = ONNXNLI(onnx_dir, precision=precision, providers=["CPUExecutionProvider"])
        return torch.cat([backend._logits(pairs[i : i + 16]) for i in range(0, len(pairs), 16)])

    fp32 = logits("fp32")
    diff = float((fp32 - expected).abs().max())
    if diff > atol:
        raise ExportError(
            f"ONNX fp32 logits differ from PyTorch by {diff:.2e} (> {atol:g}) on the probe set"
        )
    labels = fp32.argmax(-1)
    names = {column: name for name, column in reference.columns.items()}
    counts = Counter(names[int(i)] for i in labels)
    named = torch.softmax(expected, dim=-1)[:, [reference.columns[n] for n in NLI_LABELS]]
    parity = Parity(
        len(pairs),
        diff,
        label_counts={n: counts[n] for n in NLI_LABELS},
        atol=atol,
        floor=floor,
        probe=pairs,
        reference_probs=named.tolist(),
    )
    for precision in precisions:
        agree = float((logits(precision).argmax(-1) == labels).float().mean())
        parity.agreement[precision] = agree
        if agree < floor:
            raise ExportError(
                f"ONNX {precision} agrees with fp32 on {agree:.1%} of probe labels (< {floor:.0%})"
            )
    return parity


def served_parity(
    backend: ONNXNLI, reference: dict[str, Any], *, atol: float, floor: float
) -> dict[str, Any]:
    """Re-run the recorded probe set on `backend` (its provider and precision) and compare with
    the fp32 PyTorch probabilities recorded at export: fp32 must match within `atol`, every
    precision must agree on the label of at least `floor` of the pairs. Raises ParityError
    naming the provider, the precision and the worst pair; returns the figures otherwise."""
    import torch

    if list(reference.get("labels", [])) != list(NLI_LABELS):
        raise ParityError(f"the parity reference's labels are {reference.get('labels')!r}")
    pairs = [(str(p), str(h)) for p, h in reference["pairs"]]
    expected = torch.tensor(reference["probs"], dtype=torch.float32)
    if expected.shape != (len(pairs), len(NLI_LABELS)):
        shape = tuple(expected.shape)
        raise ParityError(f"the parity reference has {len(pairs)} pairs but probs of {shape}")
    got = torch.tensor(
        [[getattr(p, n) for n in NLI_LABELS] for p in backend.predict(pairs)], dtype=torch.float32
    )
    diff = (got - expected).abs().max(-1).values
    agrees = got.argmax(-1) == expected.argmax(-1)
    agreement = float(agrees.float().mean())
    result = {
        "provider": backend.provider,
        "precision": backend.precision,
        "probe_pairs": len(pairs),
        "max_abs_prob_diff": float(diff.max()),
        "label_agreement": agreement,
    }
    where = f"ONNX {backend.precision} on {backend.provider}"
    if backend.precision == "fp32" and result["max_abs_prob_diff"] > atol:
        worst = int(diff.argmax())
        raise ParityError(
            f"{where}: probabilities differ from the exported PyTorch reference by up to "
            f"{result['max_abs_prob_diff']:.2e} (> atol {atol:g}) on {len(pairs)} probe pairs; "
            f"worst pair {_show(pairs[worst])}: {_probs(got[worst])} vs {_probs(expected[worst])}"
        )
    if agreement < floor:
        worst = int(torch.where(agrees, -1.0, diff).argmax())
        raise ParityError(
            f"{where}: agrees with the exported fp32 PyTorch labels on {agreement:.1%} of "
            f"{len(pairs)} probe pairs (< floor {floor:.0%}); worst pair {_show(pairs[worst])}: "
            f"{_probs(got[worst])} vs {_probs(expected[worst])}"
        )
    return result


def _show(pair: Pair, width: int = 80) -> str:
    def cut(text: str) -> str:
        return text if len(text) <= width else text[: width - 3] + "..."

    return f"(premise {cut(pair[0])!r}, hypothesis {cut(pair[1])!r})"


def _probs(row) -> str:  # torch.Tensor of NLI_LABELS probabilities
    return ", ".join(f"{n}={float(v):.4f}" for n, v in zip(NLI_LABELS, row, strict=True))
