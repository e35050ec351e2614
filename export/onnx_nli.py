"""The NLI model to ONNX (optimum-onnx), its int8 and fp16 variants, and a parity check.

Parity is checked before anything is written to a bundle: the fp32 graph must give the
PyTorch logits within `atol` on a probe set, and each reduced-precision graph must agree with
fp32 on the label of at least `floor` of the probe pairs.
"""

from __future__ import annotations

import logging
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stepgap.teacher.nli.base import Pair
from stepgap.teacher.nli.hf import NLI_LABELS
from stepgap.teacher.nli.onnx import ONNX_FILES

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


@dataclass
class Parity:
    pairs: int
    fp32_max_abs_diff: float
    agreement: dict[str, float] = field(default_factory=dict)  # precision -> label agreement
    # fp32 labels on the probe set: agreement over one class only would say little
    label_counts: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "probe_pairs": self.pairs,
            "fp32_max_abs_logit_diff": self.fp32_max_abs_diff,
            "label_agreement_with_fp32": self.agreement,
            "fp32_label_counts": self.label_counts,
        }


def export_onnx(model: str, out_dir: str | Path, *, int8: bool = False, fp16: bool = False) -> Path:
    """Write model.onnx (+ model_quantized.onnx, model_fp16.onnx), tokenizer and config."""
    import torch
    from optimum.exporters.onnx import onnx_export_from_model
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    # Loaded here (fp32, eval) rather than by optimum's main_export, which still passes the
    # deprecated `torch_dtype` to transformers and warns on every export.
    source = AutoModelForSequenceClassification.from_pretrained(model, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model)
    onnx_export_from_model(
        source, out, opset=OPSET, task="text-classification", do_validation=False,
        preprocessors=[tokenizer],
    )  # fmt: skip
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from onnxruntime.quantization.shape_inference import quant_pre_process

        # ORT's pre-processing first (graph optimisation, ONNX shape inference; its symbolic
        # shape inference cannot follow DeBERTa's relative-position graph)
        prepared = out / "model_prepared.onnx"
        quant_pre_process(out / ONNX_FILES["fp32"], prepared, skip_symbolic_shape=True)
        quantize_dynamic(prepared, out / ONNX_FILES["int8"], weight_type=QuantType.QInt8)
        prepared.unlink()
    if fp16:
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        graph = convert_float_to_float16(onnx.load(out / ONNX_FILES["fp32"]), keep_io_types=True)
        onnx.save(graph, out / ONNX_FILES["fp16"])
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
    from stepgap.teacher.nli.onnx import ONNXNLI

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
    parity = Parity(len(pairs), diff, label_counts={n: counts[n] for n in NLI_LABELS})
    for precision in precisions:
        agree = float((logits(precision).argmax(-1) == labels).float().mean())
        parity.agreement[precision] = agree
        if agree < floor:
            raise ExportError(
                f"ONNX {precision} agrees with fp32 on {agree:.1%} of probe labels (< {floor:.0%})"
            )
    return parity
