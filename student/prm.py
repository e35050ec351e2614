"""The typed process reward model (PRM): the hybrid checker distilled into one forward pass.

A PRM is a transformers token-classification model (an encoder such as DeBERTa-v3 or
ModernBERT, or a small decoder through `AutoModelForTokenClassification`) that reads a whole
segmented trace once, with a marker token (the tokenizer's separator, else its end-of-text
token) after each step, and predicts at each marker two things, as Math-Shepherd-style PRMs read
a tag after each step:

- the label (no_gap, CC, IE, MB): the first `len(LABELS)` columns of the classifier;
- the stage that fired (the last token of the teacher's tree path, one of `FIRING_TOKENS`):
  the remaining columns. The two groups of columns are two heads, two independent linear maps
  of the marker's hidden state, softmaxed and trained (a cross-entropy each) apart.

The verdict keeps the label, its repair and a path of one token, the stage that fired; the stage
is the most likely one of those that can give the predicted label, so path and label never
contradict each other. Its confidence is the label head's probability. The judge's quote and
reasons, and the NLI calls, are not kept: a PRM never made them.

What the model reads of a trace (`PRMFormat`): the question, then per step its type, claim,
query, the first `evidence_tokens` tokens of its evidence and, for a conclusion, its answer,
then the marker. Of a trace longer than `max_length` tokens, the steps whose marker falls past
the window are failures (error verdicts naming the window), never guesses.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stepgap.schema import LABELS, REPAIRS, Step, Trace, Verdict
from stepgap.teacher.checker import StepChecker

log = logging.getLogger(__name__)

PRM_META = "stepgap_prm.json"  # beside a PRM's weights: how it reads a trace
PRM_KIND = "prm"  # a bundle's `student.kind` for a PRM ("generative" for the judge student)
IGNORE = -100  # the label of every position that is not a step's marker (transformers' own)

# The label each stage that can end a tree path gives (docs/contract.md, section 3). A stage C
# path ends without a quote for an inference step (no gap) or, under the `-E` ablation, for a
# conclusion (IE).
FIRING: dict[str, tuple[str, ...]] = {
    "stageA:off_target:entity_drift": ("CC",),
    "stageA:off_target:relation_drift": ("CC",),
    "stageA:off_target:scope_drift": ("CC",),
    "stageA:off_target:none": ("CC",),
    "stageB:grounded_abstention": ("no_gap",),
    "stageB:wrong_abstention": ("CC",),
    "stageC:entity_mismatch": ("IE",),
    "stageC:quote_not_verbatim": ("no_gap", "IE"),
    "stageC:no_quote": ("no_gap", "IE"),
    "stageD:entailment": ("no_gap",),
    "stageD:neutral": ("MB",),
    "stageD:contradiction": ("CC",),
    "stageE:no_premises": ("IE",),
    "stageE:entailed": ("no_gap",),
    "stageE:not_entailed": ("IE",),
}
FIRING_TOKENS: tuple[str, ...] = tuple(FIRING)
COLUMNS = len(LABELS) + len(FIRING_TOKENS)


def head_labels() -> dict[int, str]:
    """`id2label` of a PRM's classifier: the label head's columns, then the stage head's."""
    names = [f"label:{x}" for x in LABELS] + [f"stage:{s}" for s in FIRING_TOKENS]
    return dict(enumerate(names))


def head_config() -> dict[str, Any]:
    """The classifier keys of a PRM's transformers config: its columns and their names, both
    ways (what a fresh PRM is built or loaded with)."""
    labels = head_labels()
    return {
        "num_labels": COLUMNS,
        "id2label": labels,
        "label2id": {v: k for k, v in labels.items()},
    }


def step_targets(verdict: Verdict) -> tuple[int, int]:
    """(label column, stage column) a teacher verdict trains; IGNORE for a failed check, and
    for a stage its path does not end with (a verdict of an older tree)."""
    if verdict.label is None:
        return IGNORE, IGNORE
    last = verdict.path[-1] if verdict.path else None
    stage = FIRING_TOKENS.index(last) if last in FIRING else IGNORE
    return LABELS.index(verdict.label), stage


@dataclass(frozen=True)
class PRMFormat:
    """How a PRM reads a trace; saved beside its weights (`PRM_META`) and in its bundle."""

    max_length: int = 512  # the window, in tokens (the model's positions, or fewer)
    evidence_tokens: int = 96  # of each step's evidence (its snippets' titles and texts)
    question_tokens: int = 64
    marker: str | None = None  # the marker token; None: the separator, else end-of-text

    @classmethod
    def read(cls, folder: str | Path) -> PRMFormat:
        return cls(**prm_meta(folder)["format"])

    def write(self, folder: str | Path, **extra: Any) -> None:
        meta = {"kind": PRM_KIND, "format": asdict(self), "heads": head_labels(), **extra}
        (Path(folder) / PRM_META).write_text(json.dumps(meta, indent=2), encoding="utf-8")

    def marker_for(self, tokenizer: Any) -> str:
        marker = self.marker or tokenizer.sep_token or tokenizer.eos_token
        if marker is None:
            raise ValueError(
                "the PRM's tokenizer has no separator or end-of-text token: set marker"
            )
        return marker


def is_prm(folder: str | Path) -> bool:
    """Whether `folder` is a PRM's (its `PRM_META` beside the weights), not a judge student's."""
    return (Path(folder) / PRM_META).is_file()


def prm_meta(folder: str | Path) -> dict[str, Any]:
    """A PRM folder's `PRM_META`: its format, heads, and what training recorded (the traces it
    trained on, its base)."""
    return json.loads((Path(folder) / PRM_META).read_text(encoding="utf-8"))


def step_text(step: Step) -> tuple[str, str]:
    """(what the step says and asks, its evidence) as the PRM reads them."""
    head = f"{step.type}: {step.claim}"
    if step.query:
        head += f" search: {step.query}"
    if step.answer is not None:
        head += f" answer: {step.answer}"
    evidence = " ".join(f"({s.title}) {s.text}" if s.title else s.text for s in step.evidence)
    return head, evidence


@dataclass
class Encoded:
    """A trace as token ids, with the position of each step's marker (None past the window)."""

    input_ids: list[int]
    markers: list[int | None]
    length: int  # tokens the whole trace needed (more than input_ids when it was cut)


class PRMEncoder:
    """Traces to token ids with a marker after each step (`PRMFormat`)."""

    def __init__(self, tokenizer: Any, fmt: PRMFormat) -> None:
        self.tokenizer = tokenizer
        self.format = fmt
        self.marker_id = tokenizer.convert_tokens_to_ids(fmt.marker_for(tokenizer))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        cls_id = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else None
        self.start = [cls_id] if cls_id is not None else []

    def _ids(self, text: str, limit: int | None = None) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids[:limit] if limit is not None else ids

    def encode(self, trace: Trace) -> Encoded:
        fmt = self.format
        ids = [*self.start, *self._ids(trace.question, fmt.question_tokens), self.marker_id]
        positions: list[int] = []
        for step in trace.steps or []:
            head, evidence = step_text(step)
            ids += self._ids(head) + self._ids(evidence, fmt.evidence_tokens) + [self.marker_id]
            positions.append(len(ids) - 1)
        inside = [p if p < fmt.max_length else None for p in positions]
        return Encoded(ids[: fmt.max_length], inside, len(ids))

    def batch(self, encoded: Sequence[Encoded]) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, attention_mask), right-padded to the longest."""
        width = max(len(e.input_ids) for e in encoded)
        ids = np.full((len(encoded), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encoded), width), dtype=np.int64)
        for row, e in enumerate(encoded):
            ids[row, : len(e.input_ids)] = e.input_ids
            mask[row, : len(e.input_ids)] = 1
        return ids, mask


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def decide_step(logits: np.ndarray) -> tuple[str, str, float, float]:
    """(label, firing stage, label probability, stage probability) at one marker. The stage is
    the most likely of those that can give the label."""
    label_p = softmax(logits[: len(LABELS)])
    stage_p = softmax(logits[len(LABELS) :])
    label = LABELS[int(label_p.argmax())]
    allowed = [i for i, s in enumerate(FIRING_TOKENS) if label in FIRING[s]]
    stage = max(allowed, key=lambda i: stage_p[i])
    return label, FIRING_TOKENS[stage], float(label_p.max()), float(stage_p[stage])


class PRMRunner(ABC):
    """What computes a PRM's logits: PyTorch (`TorchPRM`) or ONNX Runtime (`ONNXPRM`)."""

    name: str  # what provenance records: `prm:FOLDER` with the precision for ONNX
    note: str | None = None  # a stand-in model's note

    @abstractmethod
    def logits(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """(batch, sequence, COLUMNS) float32."""


class TorchPRM(PRMRunner):
    """A PRM folder (safetensors) on PyTorch."""

    def __init__(self, folder: str | Path, device: str | None = None) -> None:
        import torch
        from transformers import AutoModelForTokenClassification

        from stepgap.models import display_ref, explain_load_errors, resolve_device, stand_in_note

        self.device = resolve_device(device, "the PRM")
        with explain_load_errors(str(folder), "PRM"):
            self.model = AutoModelForTokenClassification.from_pretrained(
                str(folder), dtype=torch.float32, use_safetensors=True
            )
        self.model.to(self.device).eval()
        self.name = f"prm:{display_ref(folder)}"
        self.note = stand_in_note(self.model.config)
        self._torch = torch

    def logits(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            out = self.model(
                input_ids=torch.from_numpy(input_ids).to(self.device),
                attention_mask=torch.from_numpy(attention_mask).to(self.device),
            )
        return out.logits.float().cpu().numpy()


class ONNXPRM(PRMRunner):
    """A PRM exported to ONNX (`model.onnx`, `model_quantized.onnx` for int8) on ONNX Runtime's
    execution providers (default CUDA where available, then the CPU)."""

    def __init__(
        self, folder: str | Path, precision: str = "fp32", providers: Sequence[Any] | None = None
    ) -> None:
        import onnxruntime as ort
        from transformers import AutoConfig

        from stepgap.models import display_ref, stand_in_note
        from stepgap.teacher.nli.onnx import ONNX_FILES, default_providers

        if precision not in ("fp32", "int8"):
            raise ValueError(f"a PRM's ONNX precision is fp32 or int8, not {precision!r}")
        model_file = Path(folder) / ONNX_FILES[precision]
        if not model_file.is_file():
            raise FileNotFoundError(f"{model_file}: no {precision} ONNX PRM in this folder")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self.session = ort.InferenceSession(
            str(model_file), options, providers=list(providers or default_providers())
        )
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.precision = precision
        self.provider = self.session.get_providers()[0]
        self.name = f"prm:{display_ref(folder)} (onnx {precision})"
        self.note = stand_in_note(AutoConfig.from_pretrained(str(folder)))

    def logits(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        feed = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "token_type_ids" in self.inputs:
            feed["token_type_ids"] = np.zeros_like(input_ids)
        (logits,) = self.session.run(
            ["logits"], {k: v for k, v in feed.items() if k in self.inputs}
        )
        return logits


class PRMChecker(StepChecker):
    """A PRM as a checker: one forward pass a batch of traces, every step labelled, no judge
    and no NLI model. `batch_size`: traces a forward pass."""

    judge = None

    def __init__(
        self, runner: PRMRunner, tokenizer: Any, fmt: PRMFormat, batch_size: int = 8
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.runner = runner
        self.encoder = PRMEncoder(tokenizer, fmt)
        self.format = fmt
        self.batch_size = batch_size

    @classmethod
    def from_folder(
        cls, folder: str | Path, device: str | None = None, **options: Any
    ) -> PRMChecker:
        """A trained PRM's folder (what `student/train.py` writes for a `prm` recipe) on
        PyTorch."""
        from stepgap.models import load_tokenizer

        return cls(
            TorchPRM(folder, device), load_tokenizer(str(folder)), PRMFormat.read(folder), **options
        )

    @property
    def provenance(self) -> dict[str, object]:
        return {
            "prm": {"spec": self.runner.name, "note": self.runner.note},
            "judge": None,
            "nli": None,
        }

    def check(self, traces: Sequence[Trace]) -> list[list[Verdict]]:
        out: list[list[Verdict]] = []
        for start in range(0, len(traces), self.batch_size):
            out += self._check_batch(traces[start : start + self.batch_size])
        return out

    def _check_batch(self, traces: Sequence[Trace]) -> list[list[Verdict]]:
        for t in traces:
            if t.steps is None:
                raise ValueError(f"trace {t.id!r} is not segmented; run segment_trace first")
        encoded = [self.encoder.encode(t) for t in traces]
        logits = self.runner.logits(*self.encoder.batch(encoded))
        return [
            [self._verdict(t, step, e.markers[k], e.length, logits[row])
             for k, step in enumerate(t.steps or [])]
            for row, (t, e) in enumerate(zip(traces, encoded, strict=True))
        ]  # fmt: skip

    def _verdict(
        self, trace: Trace, step: Step, position: int | None, length: int, logits: np.ndarray
    ) -> Verdict:
        from stepgap.teacher.prompt import PROMPT_VERSION

        base: dict[str, Any] = {
            "trace_id": trace.id, "step": step.index, "type": step.type,
            "prompt_version": PROMPT_VERSION, "question": trace.question, "step_data": step,
            "checker": self.provenance,
        }  # fmt: skip
        if position is None:
            return Verdict(
                **base, label=None, repair=None,
                error=f"past the PRM's window: the trace needs {length} tokens and the PRM "
                f"reads {self.format.max_length}; step {step.index} is not labelled",
            )  # fmt: skip
        label, stage, p_label, p_stage = decide_step(logits[position])
        return Verdict(
            **base, label=label, repair=REPAIRS[label], path=[stage], confidence=p_label,
            rationale=f"PRM: {label} at {stage} (p={p_label:.2f}; stage p={p_stage:.2f})",
            judge_confidences={"label": p_label, "stage": p_stage},
        )  # fmt: skip


TINY_PRM_REF = "tiny-random:deberta-v2"  # the tiny PRM base, built from the training data
BERT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny_prm_base(path: str | Path, texts: Sequence[str], seed: int = 0) -> Path:
    """Build (once) a tiny random DeBERTa-v2 token classifier with the PRM's two heads under
    `path`, with a byte-level BPE vocabulary trained on `texts` and BERT's special tokens:
    the `prm-tiny` recipe's base, for CPU tests and demos."""
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import (
        DebertaV2Config,
        DebertaV2ForTokenClassification,
        PreTrainedTokenizerFast,
    )

    from stepgap.models import STAND_IN_KEY

    backend = Tokenizer(models.BPE(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=2048,
            special_tokens=BERT_SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[(t, backend.token_to_id(t)) for t in ("[CLS]", "[SEP]")],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=512,
    )  # fmt: skip
    config = DebertaV2Config(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=512, relative_attention=True,
        position_buckets=64, pos_att_type=["p2c", "c2p"], position_biased_input=False,
        type_vocab_size=0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        pad_token_id=tokenizer.pad_token_id, **head_config(),
    )  # fmt: skip
    setattr(config, STAND_IN_KEY, f"a tiny random-weight DeBERTa-v2 PRM ({TINY_PRM_REF})")
    torch.manual_seed(seed)
    DebertaV2ForTokenClassification(config).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
