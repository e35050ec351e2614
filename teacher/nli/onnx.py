"""`onnx:PATH`: an NLI cross-encoder exported by `stepgap export`, run by ONNX Runtime.

A reward worker then needs no second PyTorch model for stages D-E. Tokenization, premise-only
truncation, batching and the label-column logic are the PyTorch backend's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stepgap.models import explain_load_errors

from .base import Pair
from .hf import HFNLI, labels_from_id2label, special_token_pattern

ONNX_FILES = {"fp32": "model.onnx", "fp16": "model_fp16.onnx", "int8": "model_quantized.onnx"}


def default_providers() -> list[str]:
    import onnxruntime as ort

    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


class ONNXNLI(HFNLI):
    def __init__(
        self,
        path: str | Path,
        *,
        precision: str = "fp32",
        providers: Sequence[str] | None = None,
        batch_size: int = 32,
        max_length: int = 512,
    ) -> None:
        import onnxruntime as ort
        import torch
        from transformers import AutoConfig, AutoTokenizer

        path = Path(path)
        if precision not in ONNX_FILES:
            raise ValueError(f"precision must be one of {sorted(ONNX_FILES)}, got {precision!r}")
        model_file = path / ONNX_FILES[precision]
        if not model_file.is_file():
            raise FileNotFoundError(f"{model_file}: no {precision} ONNX model in this folder")
        self.name = f"onnx:{path}"
        self.model_id = str(path)
        self.precision = precision
        self.device = "cpu"  # inputs are numpy; the session places them
        self.batch_size = batch_size
        self.max_length = max_length
        self._torch = torch
        with explain_load_errors(str(path), "NLI tokenizer"):
            self.tokenizer = AutoTokenizer.from_pretrained(path)
        self._specials = special_token_pattern(self.tokenizer)
        options = ort.SessionOptions()
        options.log_severity_level = 3  # fp16 graphs warn about every unfoldable constant
        self.session = ort.InferenceSession(
            str(model_file), options, providers=list(providers or default_providers())
        )
        self.input_names = {i.name for i in self.session.get_inputs()}
        config = self._config = AutoConfig.from_pretrained(path)
        if config.num_labels != 3:
            raise ValueError(f"{path} has {config.num_labels} output labels; an NLI model needs 3")
        self.columns = labels_from_id2label(config.id2label) or self._probe_columns()

    @property
    def config(self) -> object:
        return self._config

    def _logits(self, pairs: Sequence[Pair]):
        enc = self._encode(pairs, tensors="np")
        feed = {k: v.astype("int64") for k, v in enc.items() if k in self.input_names}
        (logits,) = self.session.run(["logits"], feed)
        return self._torch.from_numpy(logits).float()
