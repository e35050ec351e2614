"""The offline checker: a bundle in, verdicts out; no API key, no network.

`OfflineChecker.from_bundle` verifies every checksum, switches the Hub client offline, loads
the ONNX NLI model on the chosen execution providers and re-runs the bundle's parity probe there,
loads the student (safetensors only, no remote code), and runs them through the same decision
tree as the teacher with the thresholds recorded at export.

`load_checker` is what the command line and a reward worker build from a `CheckerConfig`: a
bundle's offline checker, or the hybrid checker of its judge and NLI specs (`build_checker`),
with the student's `student:PATH` judge among the specs.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from stepgap.registry import call_checked

# importing the student's judge registers `student:PATH` among the judges load_checker builds
from stepgap.student.judge import ServedStudentJudge, StudentJudge, student_meta
from stepgap.teacher.build import LOCAL_NAMES, CheckerConfig, build_judge_with
from stepgap.teacher.checker import Checker
from stepgap.teacher.judges import JudgeBackend
from stepgap.teacher.nli.onnx import Provider, parse_providers
from stepgap.tree import TreeConfig

from .bundle import Bundle, BundleError, read_bundle
from .onnx_nli import ParityError, served_parity

log = logging.getLogger(__name__)


def go_offline() -> None:
    """Make every Hugging Face load local-only, also for libraries imported already."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import huggingface_hub.constants as constants

        constants.HF_HUB_OFFLINE = True
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        pass


class OfflineChecker(Checker):
    """The hybrid checker of an exported bundle: its student as the judge, its ONNX NLI model
    and the thresholds it recorded."""

    manifest: dict[str, Any]
    # the bundle's parity probe as re-run at load: provider, precision, figures
    nli_parity: dict[str, Any] | None

    @classmethod
    def from_bundle(
        cls,
        path: str | Path,
        *,
        nli_precision: str | None = None,
        nli_providers: Sequence[Provider] | None = None,
        nli_device: str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        batch_size: int = 8,
        max_new_tokens: int = 768,
        nli_batch_size: int = 32,
        engine: str = "auto",
        online: bool = False,
        kv_cache_gib: float | None = None,
        served_judge: Callable[[Bundle], JudgeBackend] | None = None,
    ) -> OfflineChecker:
        """`nli_providers`: ONNX Runtime execution providers for the NLI model, in order of
        preference, each a name or (name, provider options), e.g. `["CUDAExecutionProvider",
        "CPUExecutionProvider"]`; default CUDA when available, then CPU. `nli_device` (`cpu`,
        `cuda`, `cuda:1`) instead picks the provider that places it there; `device` is the
        student's. The bundle's probe pairs are re-run on the provider and precision that will
        serve before the student loads: probabilities off the recorded PyTorch ones raise
        BundleError.

        `engine`: how the student decodes (`auto`, `vllm`, `hf`; see `HFJudge`), `online`: on
        vLLM's async engine, for a server. `served_judge(bundle)`: the bundle's student as
        served elsewhere (an OpenAI-compatible engine: `served_student`), used instead of
        loading the student here."""
        from stepgap.teacher.nli.onnx import ONNXNLI

        go_offline()
        bundle = read_bundle(path)
        nli = ONNXNLI(
            bundle.nli_dir,
            precision=nli_precision or bundle.nli_precision,
            providers=nli_providers,
            device=nli_device,
            batch_size=nli_batch_size,
        )
        served = None
        if bundle.parity_reference is not None:
            try:
                served = served_parity(
                    nli, bundle.parity_reference, atol=bundle.parity_atol, floor=bundle.parity_floor
                )
            except ParityError as exc:
                raise BundleError(f"{bundle.root}: {exc}") from None
            log.info("%s: NLI parity holds on %s (%s)", bundle.root, nli.provider, nli.precision)
        else:
            log.warning(
                "%s: the bundle records no parity reference (exported by an older stepgap), so "
                "the NLI model is not checked on %s; re-export to check it",
                bundle.root,
                nli.provider,
            )
        judge: JudgeBackend
        if served_judge is not None:
            judge = served_judge(bundle)
        else:
            judge = StudentJudge(
                str(bundle.student_dir),
                base=bundle.student_base,
                base_revision=bundle.student_base_revision,
                device=device,
                dtype=dtype,
                batch_size=batch_size,
                max_new_tokens=max_new_tokens,
                engine=engine,
                online=online,
                kv_cache_gib=kv_cache_gib,
            )
        checker = cls(judge, nli, TreeConfig(**bundle.tree))
        checker.manifest = bundle.manifest
        checker.nli_parity = served
        return checker


def served_student(bundle: Bundle, name: str, **options: Any) -> JudgeBackend:
    """The bundle's student served by an OpenAI-compatible engine under model `name` (`--bundle
    B --judge openai:NAME`), prompted as it was trained (NLI features, evidence budget, target)
    and its tokens checked against the student's own tokenizer where the bundle ships one (an
    adapter may leave it to its base). `options` are the judge's (`build_judge`'s)."""
    meta = student_meta(bundle.student_dir)
    shipped = (bundle.student_dir / "tokenizer_config.json").is_file()
    return build_judge_with(
        ServedStudentJudge,
        name,
        f"the judge openai:{name} (the bundle's student, served)",
        nli_features=bool(meta.get("nli_features", False)),
        earlier_evidence_chars=meta.get("earlier_evidence_chars"),
        target=meta.get("target") or "full",  # the schema it was trained to write
        tokenizer=str(bundle.student_dir) if shipped else None,
        **options,
    )


def load_checker(config: CheckerConfig, *, online: bool = False) -> Checker:
    """The checker `config` describes: the offline checker of its bundle, or else the hybrid
    checker of its judge and NLI specs (`CheckerConfig.build`); `online`: for a server (a local
    judge on vLLM runs its async engine). With a bundle, `judge="openai:NAME"` asks the bundle's
    student served by an OpenAI-compatible engine at `base_url` instead of loading it here; the
    bundle still gives the schema, prompt version, NLI model and thresholds. The other judge
    options go to the bundle's student (`device`, `dtype`, `batch_size`, `max_tokens`,
    `engine`, `kv_cache_gib`); one it does not take is an error naming its flag."""
    if not config.bundle:
        return config.build(online=online)
    if config.nli:
        raise ValueError("--bundle brings its own NLI model; drop --nli")
    options = config.judge_options(online=online)
    served = None
    with config.said_in_flags():
        if config.judge is not None:
            kind, _, name = config.judge.partition(":")
            if kind != "openai" or not name:
                raise ValueError(
                    "with --bundle, --judge can only be openai:NAME: the bundle's student served "
                    "by an OpenAI-compatible engine (vLLM, SGLang, llama.cpp) at --base-url"
                )
            served = functools.partial(served_student, name=name, **options)
            options = {}  # every judge option is the served student's
        else:
            options.pop("prices", None)  # the bundle's student counts no cost, keeps no cache
            if options.get("cache") is False:
                options.pop("cache")
            for ours, local in LOCAL_NAMES.items():
                if ours in options:
                    options[local] = options.pop(ours)
        return call_checked(
            OfflineChecker.from_bundle,
            str(config.bundle),
            f"the checker of --bundle {config.bundle}",
            nli_precision=config.nli_precision,
            nli_providers=parse_providers(config.nli_provider),
            nli_device=config.device,
            served_judge=served,
            **options,
        )
