"""A PRM (`student/prm.py`) to ONNX, its int8 variant, and a parity check at the step markers.

The graph takes `input_ids`, `attention_mask` (and `token_type_ids` where the model has token
types), each of shape (batch, sequence), and gives `logits` of shape (batch, sequence, columns):
the label head's columns, then the stage head's. A PRM is read only at its markers, so parity is
measured there: on probe traces (the traces of a verdicts file, else `PROBE_RESPONSES`) the fp32
graph's probabilities of both heads must match PyTorch within `atol`, and the int8 graph's label
must agree with fp32's on at least `floor` of the markers. The PyTorch probabilities travel in
the bundle with the probe traces, so loading re-checks them on the provider and precision that
will serve (`served_prm_parity`), as the NLI model's are (`onnx_nli.served_parity`).
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stepgap.schema import LABELS, Trace
from stepgap.student.prm import PRM_META, PRMEncoder, PRMFormat, PRMRunner, softmax
from stepgap.teacher.nli.onnx import ONNX_FILES

from .onnx_nli import (
    OPSET,
    ExportError,
    ParityError,
    _input_names,
    _logits_only,
    _without_exporter_notes,
    quantize_int8,
)

# Search-R1 responses segmented into the probe traces used when no verdicts file is given: a
# search, a grounded inference, an abstention and a conclusion.
PROBE_RESPONSES: list[tuple[str, str]] = [
    (
        "What is the capital of France?",
        "<think>I need the capital of France.</think><search>capital of France</search>\n\n"
        '<information>Doc 1(Title: "France") Paris is the capital and largest city of France.'
        "</information>\n\n<think>The capital of France is Paris.</think><answer>Paris</answer>",
    ),
    (
        "Who directed the film Rashomon?",
        "<think>Rashomon is a Japanese film; I should search its director.</think>"
        '<search>Rashomon director</search>\n\n<information>Doc 1(Title: "Rashomon") Rashomon '
        "is a 1950 film directed by Akira Kurosawa.</information>\n\n<think>The evidence does "
        "not say where Kurosawa was born.</think><search>Akira Kurosawa birthplace</search>\n\n"
        '<information>Doc 1(Title: "Air North") Air North is Yukon\'s airline.</information>'
        "\n\n<think>Kurosawa directed it.</think><answer>Akira Kurosawa</answer>",
    ),
]


def probe_traces(verdicts: str | Path | None = None) -> list[Trace]:
    """The parity probe: the traces a verdicts file stores (question and step data), else the
    segmented `PROBE_RESPONSES`."""
    if verdicts is not None:
        from stepgap.io import ErrorReport, read_models
        from stepgap.schema import Verdict
        from stepgap.student.mining import pool_traces

        traces = pool_traces([v for _, v in read_models(verdicts, Verdict, ErrorReport())])
        if not traces:
            raise ExportError(f"{verdicts}: no verdict stores its question and step data")
        return traces
    from stepgap.segment import segment_trace

    return [
        segment_trace(Trace(id=f"stepgap-probe-{k}", question=q, response=r))
        for k, (q, r) in enumerate(PROBE_RESPONSES)
    ]


def export_prm_onnx(folder: str | Path, out_dir: str | Path, *, int8: bool = False) -> Path:
    """Write model.onnx (+ model_quantized.onnx), tokenizer, config and `PRM_META` of the PRM
    in `folder` (safetensors) under `out_dir`."""
    import torch
    from transformers import AutoModelForTokenClassification

    from stepgap.models import explain_load_errors, load_tokenizer

    folder, out = Path(folder), Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with explain_load_errors(str(folder), "PRM"):
        source = AutoModelForTokenClassification.from_pretrained(
            str(folder), dtype=torch.float32, use_safetensors=True
        ).eval()
    tokenizer = load_tokenizer(str(folder))
    encoder = PRMEncoder(tokenizer, PRMFormat.read(folder))
    names = _input_names(source.config)
    # two traces of unequal length: padding, so the traced graph keeps the attention mask's path
    ids, mask = encoder.batch([encoder.encode(t) for t in probe_traces()])
    sample = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    axes = {n: {0: "batch_size", 1: "sequence_length"} for n in [*names, "logits"]}
    with _without_exporter_notes(), torch.no_grad():
        torch.onnx.export(
            _logits_only(source, names),
            tuple(torch.from_numpy(sample[n]) for n in names),
            str(out / ONNX_FILES["fp32"]),
            input_names=names,
            output_names=["logits"],
            dynamic_axes=axes,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    source.config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    shutil.copy2(folder / PRM_META, out / PRM_META)
    if int8:
        quantize_int8(out / ONNX_FILES["fp32"], out / ONNX_FILES["int8"])
    return out


def marker_logits(runner: PRMRunner, encoder: PRMEncoder, traces: Sequence[Trace]) -> np.ndarray:
    """(markers, columns): the logits at every step marker inside the window, trace by trace."""
    rows = []
    for trace in traces:
        encoded = encoder.encode(trace)
        logits = runner.logits(*encoder.batch([encoded]))[0]
        rows += [logits[p] for p in encoded.markers if p is not None]
    if not rows:
        raise ExportError("no probe trace has a step inside the PRM's window")
    return np.stack(rows).astype(np.float32)


def head_probs(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(label probabilities, stage probabilities) of marker logits (markers, columns)."""
    return softmax(logits[:, : len(LABELS)]), softmax(logits[:, len(LABELS) :])


@dataclass
class PRMParity:
    traces: int
    markers: int
    fp32_max_abs_diff: float  # of the two heads' probabilities
    agreement: dict[str, float] = field(default_factory=dict)  # precision -> label agreement
    label_counts: dict[str, int] = field(default_factory=dict)  # fp32 labels at the markers
    atol: float = 1e-3
    floor: float = 0.99
    probe: list[Trace] = field(default_factory=list)
    label_probs: list[list[float]] = field(default_factory=list)  # PyTorch fp32, LABELS order
    stage_probs: list[list[float]] = field(default_factory=list)  # FIRING_TOKENS order

    def as_dict(self) -> dict[str, object]:
        return {
            "probe_traces": self.traces,
            "probe_markers": self.markers,
            "fp32_max_abs_prob_diff": self.fp32_max_abs_diff,
            "label_agreement_with_fp32": self.agreement,
            "fp32_label_counts": self.label_counts,
            "atol": self.atol,
            "floor": self.floor,
        }

    def reference(self) -> dict[str, object]:
        """The probe traces with PyTorch's probabilities at their markers, as a bundle stores it."""
        return {
            "labels": list(LABELS),
            "traces": [t.model_dump(mode="json", exclude_none=True) for t in self.probe],
            "label_probs": self.label_probs,
            "stage_probs": self.stage_probs,
        }


def check_prm_parity(
    folder: str | Path,
    onnx_dir: str | Path,
    precisions: Sequence[str] = (),
    *,
    probe: Sequence[Trace] = (),
    atol: float = 1e-3,
    floor: float = 0.99,
) -> PRMParity:
    """Compare PyTorch (`folder`) and ONNX (`onnx_dir`, read with its own copied tokenizer) at
    the probe traces' markers; raise ExportError naming the figures when out of bounds."""
    from stepgap.models import load_tokenizer
    from stepgap.student.prm import ONNXPRM, TorchPRM

    traces = list(probe) or probe_traces()
    encoder = PRMEncoder(load_tokenizer(str(onnx_dir)), PRMFormat.read(onnx_dir))
    expected = head_probs(marker_logits(TorchPRM(folder, device="cpu"), encoder, traces))

    def run(precision: str) -> tuple[np.ndarray, np.ndarray]:
        runner = ONNXPRM(onnx_dir, precision, providers=["CPUExecutionProvider"])
        return head_probs(marker_logits(runner, encoder, traces))

    fp32 = run("fp32")
    diff = max(float(np.abs(g - e).max()) for g, e in zip(fp32, expected, strict=True))
    markers = len(expected[0])
    if diff > atol:
        raise ExportError(
            f"ONNX fp32 PRM probabilities differ from PyTorch by {diff:.2e} (> atol {atol:g}) "
            f"at {markers} markers of {len(traces)} probe traces"
        )
    labels = fp32[0].argmax(-1)
    counts = Counter(LABELS[int(i)] for i in labels)
    parity = PRMParity(
        len(traces), markers, diff, label_counts={n: counts[n] for n in LABELS}, atol=atol,
        floor=floor, probe=traces, label_probs=expected[0].tolist(),
        stage_probs=expected[1].tolist(),
    )  # fmt: skip
    for precision in precisions:
        agree = float((run(precision)[0].argmax(-1) == labels).mean())
        parity.agreement[precision] = agree
        if agree < floor:
            raise ExportError(
                f"ONNX {precision} PRM agrees with fp32 on {agree:.1%} of {markers} probe "
                f"markers' labels (< floor {floor:.0%})"
            )
    return parity


def served_prm_parity(
    runner: Any, encoder: PRMEncoder, reference: dict[str, Any], *, atol: float, floor: float
) -> dict[str, Any]:
    """Re-run the recorded probe traces on `runner` (an `ONNXPRM`: its provider and precision)
    and compare with the fp32 PyTorch probabilities recorded at export: fp32 must match within
    `atol` (both heads), every precision must agree on the label at least at `floor` of the
    markers. Raises ParityError naming provider, precision and figures; returns the figures."""
    if list(reference.get("labels", [])) != list(LABELS):
        raise ParityError(f"the PRM parity reference's labels are {reference.get('labels')!r}")
    traces = [Trace.model_validate(t) for t in reference["traces"]]
    want = (np.asarray(reference["label_probs"]), np.asarray(reference["stage_probs"]))
    got = head_probs(marker_logits(runner, encoder, traces))
    if any(g.shape != w.shape for g, w in zip(got, want, strict=True)):
        raise ParityError(
            f"the PRM parity reference holds {len(want[0])} markers; its traces give {len(got[0])}"
        )
    diff = max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True))
    agreement = float((got[0].argmax(-1) == want[0].argmax(-1)).mean())
    result = {
        "provider": runner.provider, "precision": runner.precision, "probe_traces": len(traces),
        "probe_markers": len(want[0]), "max_abs_prob_diff": diff, "label_agreement": agreement,
    }  # fmt: skip
    where = f"ONNX {runner.precision} PRM on {runner.provider}"
    if runner.precision == "fp32" and diff > atol:
        raise ParityError(
            f"{where}: probabilities differ from the exported PyTorch reference by up to "
            f"{diff:.2e} (> atol {atol:g}) at {len(want[0])} markers of {len(traces)} probe traces"
        )
    if agreement < floor:
        raise ParityError(
            f"{where}: agrees with the exported fp32 PyTorch labels at {agreement:.1%} of "
            f"{len(want[0])} probe markers (< floor {floor:.0%})"
        )
    return result
