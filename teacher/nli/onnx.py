"""`onnx:PATH`: an NLI cross-encoder exported by `stepgap export`, run by ONNX Runtime.

A reward worker then needs no second PyTorch model for stages D-E. Tokenization, premise-only
truncation, batching and the label-column logic are the PyTorch backend's own.

Execution providers are ONNX Runtime's (`CUDAExecutionProvider`, `CPUExecutionProvider`, ...),
each optionally with its provider options. One asked for explicitly must run the session:
ONNX Runtime itself would fall back to the CPU without a word.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from stepgap.options import option
from stepgap.tree import Pair

from .base import NLI_GROUP, NLIOptions
from .hf import HFNLI, labels_from_id2label

ONNX_FILES = {"fp32": "model.onnx", "fp16": "model_fp16.onnx", "int8": "model_quantized.onnx"}

# A provider as ONNX Runtime takes it: a name, or (name, provider options).
Provider = str | tuple[str, dict[str, Any]]


def default_providers() -> list[str]:
    import onnxruntime as ort

    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


def parse_providers(values: Iterable[str] | None) -> list[Provider] | None:
    """`--nli-provider` values: each a comma list of `NAME[:KEY=VALUE[:KEY=VALUE...]]`, e.g.
    `CUDAExecutionProvider:device_id=1,CPUExecutionProvider`; None when none was given."""
    providers: list[Provider] = []
    for value in values or ():
        for item in filter(None, (s.strip() for s in value.split(","))):
            name, *settings = item.split(":")
            options: dict[str, Any] = {}
            for setting in settings:
                key, eq, val = setting.partition("=")
                if not eq or not key:
                    raise ValueError(
                        f"nli_provider {item!r}: provider options are KEY=VALUE after the "
                        f"name, e.g. CUDAExecutionProvider:device_id=0; got {setting!r}"
                    )
                options[key] = val
            providers.append((name, options) if options else name)
    return providers or None


def device_providers(device: str) -> list[Provider]:
    """The providers of a `--device` value, so `cpu`, `cuda` and `cuda:1` place an ONNX NLI
    model as they place a PyTorch one (the one named must start: no silent fall-back)."""
    kind, _, index = device.partition(":")
    if kind == "cpu" and not index:
        return ["CPUExecutionProvider"]
    if kind == "cuda" and (not index or index.isdigit()):
        return (
            [("CUDAExecutionProvider", {"device_id": index})]
            if index
            else ["CUDAExecutionProvider"]
        )
    raise ValueError(
        f"device {device!r}: an ONNX NLI model runs on cpu, cuda or cuda:N (other ONNX Runtime "
        "providers: --nli-provider)"
    )


def resolve_providers(providers: Sequence[Provider]) -> list[tuple[str, dict[str, Any]]]:
    """Full provider names with their options; `cuda` stands for CUDAExecutionProvider.
    A provider this onnxruntime build cannot run is a ValueError listing those it can."""
    import onnxruntime as ort

    known = {p.lower(): p for p in ort.get_all_providers()}
    known.update({p.lower().removesuffix("executionprovider"): p for p in ort.get_all_providers()})
    available = ort.get_available_providers()
    resolved = []
    for entry in providers:
        name, options = (entry, {}) if isinstance(entry, str) else (entry[0], dict(entry[1]))
        full = known.get(name.lower())
        if full is None:
            raise ValueError(
                f"unknown ONNX Runtime provider {name!r}; known: {', '.join(known.values())}"
            )
        if full not in available:
            raise ValueError(
                f"ONNX Runtime provider {full} is not available in this onnxruntime "
                f"{ort.__version__} build; available: {', '.join(available)}"
                + (
                    " (CUDA needs the `gpu` extra, onnxruntime-gpu, installed instead of "
                    "onnxruntime)"
                    if full in ("CUDAExecutionProvider", "TensorrtExecutionProvider")
                    else ""
                )
            )
        resolved.append((full, {str(k): str(v) for k, v in options.items()}))
    return resolved


@dataclass(frozen=True)
class ONNXNLIOptions(NLIOptions):
    """The options of `onnx:PATH` (and of a bundle's NLI model): which graph, and on which ONNX
    Runtime execution providers."""

    nli_precision: Literal["fp32", "int8", "fp16"] | None = option(
        None,
        "ONNX NLI (onnx: or a bundle's), or a PRM bundle's PRM: which graph (default fp32, a "
        "bundle's own)",
        group=NLI_GROUP,
    )
    nli_provider: list[str] | None = option(
        None,
        "ONNX NLI (onnx: or a bundle's), or a PRM bundle's PRM: ONNX Runtime execution "
        "provider(s) in order of "
        "preference, repeated or a comma list, with provider options after the name, e.g. "
        "CUDAExecutionProvider:device_id=1,CPUExecutionProvider (default: CUDA if available, "
        "then CPU); a bundle's parity probe is re-run on them at load",
        metavar="NAME[:KEY=VALUE...]",
        group=NLI_GROUP,
    )

    def __post_init__(self) -> None:
        parse_providers(self.nli_provider)  # a malformed provider option, said now
        super().__post_init__()


class ONNXNLI(HFNLI):
    options_class = ONNXNLIOptions

    @classmethod
    def from_spec(cls, arg: str, options: ONNXNLIOptions) -> ONNXNLI:  # type: ignore[override]
        """`onnx:PATH`, an exported folder, with its options."""
        return cls(
            arg,
            precision=options.nli_precision or "fp32",
            providers=parse_providers(options.nli_provider),
            device=options.device,
        )

    def __init__(
        self,
        path: str | Path,
        *,
        precision: str = "fp32",
        providers: Sequence[Provider] | None = None,
        device: str | None = None,
        batch_size: int = 32,
        max_length: int = 512,
    ) -> None:
        """`providers`: ONNX Runtime's execution providers in order of preference, each a name
        or (name, provider options); default CUDA when available, then CPU. `device` (`cpu`,
        `cuda`, `cuda:1`) instead picks the one provider that places a model there. Every
        provider given here must start, or this raises naming it."""
        import onnxruntime as ort
        import torch
        from transformers import AutoConfig

        path = Path(path)
        if device is not None:
            if providers:
                raise ValueError("give the ONNX NLI model a device or providers, not both")
            providers = device_providers(device)
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
        self._load_tokenizer(str(path))
        options = ort.SessionOptions()
        options.log_severity_level = 3  # fp16 graphs warn about every unfoldable constant
        if providers:
            chosen = resolve_providers(providers)
            self.session = ort.InferenceSession(
                str(model_file),
                options,
                providers=[name for name, _ in chosen],
                provider_options=[opts for _, opts in chosen],
            )
            running = self.session.get_providers()
            for name, _ in chosen:
                if name not in running:  # e.g. onnxruntime-gpu without the CUDA libraries
                    raise ValueError(
                        f"{model_file}: ONNX Runtime could not start {name} (its log above says "
                        f"why); the session would run on {', '.join(running)}"
                    )
        else:
            self.session = ort.InferenceSession(
                str(model_file), options, providers=default_providers()
            )
        self.provider = self.session.get_providers()[0]
        # On CUDA the logits are bound on the device (IO binding); on CPU a plain run is as fast.
        self._bind_device: tuple[str, int] | None = None
        if self.provider == "CUDAExecutionProvider":
            cuda = self.session.get_provider_options().get(self.provider, {})
            self._bind_device = ("cuda", int(cuda.get("device_id", 0)))
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
        if self._bind_device is None:
            (logits,) = self.session.run(["logits"], feed)
        else:
            binding = self.session.io_binding()
            for name, array in feed.items():
                binding.bind_cpu_input(name, array)
            binding.bind_output("logits", *self._bind_device)
            self.session.run_with_iobinding(binding)
            (logits,) = binding.copy_outputs_to_cpu()
        return self._torch.from_numpy(logits).float()
