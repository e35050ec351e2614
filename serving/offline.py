"""The offline checker: a bundle in, verdicts out; no API key, no network.

`OfflineChecker.from_bundle` verifies every checksum, switches the Hub client offline, loads
the ONNX NLI model on the chosen execution providers and re-runs the bundle's parity probe there,
loads the student (safetensors only, no remote code), and runs them through the same decision
tree as the teacher with the thresholds recorded at export.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from stepgap.teacher.checker import Checker
from stepgap.teacher.judges import JudgeBackend
from stepgap.teacher.nli.onnx import Provider
from stepgap.tree import TreeConfig

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
        served_judge: Callable[[dict[str, Any], Path | None], JudgeBackend] | None = None,
    ) -> OfflineChecker:
        """`nli_providers`: ONNX Runtime execution providers for the NLI model, in order of
        preference, each a name or (name, provider options), e.g. `["CUDAExecutionProvider",
        "CPUExecutionProvider"]`; default CUDA when available, then CPU. `nli_device` (`cpu`,
        `cuda`, `cuda:1`) instead picks the provider that places it there; `device` is the
        student's. The bundle's probe pairs are re-run on the provider and precision that will
        serve before the student loads: probabilities off the recorded PyTorch ones raise
        BundleError.

        `engine`: how the student decodes (`auto`, `vllm`, `hf`; see `HFJudge`), `online`: on
        vLLM's async engine, for a server. `served_judge(student_meta, tokenizer_folder)`: the
        bundle's student as served elsewhere (an OpenAI-compatible engine), used instead of
        loading the student here; the folder is the student's own tokenizer, where it ships one."""
        from stepgap.export.bundle import BundleError, read_bundle
        from stepgap.export.onnx_nli import ParityError, served_parity
        from stepgap.student.judge import StudentJudge, student_meta
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
            meta = student_meta(bundle.student_dir)
            # how to prompt it (NLI features, evidence budget), and its tokenizer where it
            # ships one (an adapter may leave it to its base)
            shipped = (bundle.student_dir / "tokenizer_config.json").is_file()
            judge = served_judge(meta, bundle.student_dir if shipped else None)
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
