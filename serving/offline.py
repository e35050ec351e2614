"""The offline checker: a bundle in, verdicts out; no API key, no network.

`OfflineChecker.from_bundle` verifies every checksum, switches the Hub client offline, loads
the student (safetensors only, no remote code) and the ONNX NLI model, and runs them through the
same decision tree as the teacher with the thresholds recorded at export.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepgap.teacher.checker import Checker
from stepgap.teacher.judges import JudgeBackend
from stepgap.teacher.tree import TreeConfig


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

    @classmethod
    def from_bundle(
        cls,
        path: str | Path,
        *,
        nli_precision: str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        batch_size: int = 8,
        max_new_tokens: int = 768,
        nli_batch_size: int = 32,
        served_judge: Callable[[bool], JudgeBackend] | None = None,
    ) -> OfflineChecker:
        """`served_judge(nli_features)`: the bundle's student as served elsewhere (an
        OpenAI-compatible engine), used instead of loading the student here."""
        from stepgap.export.bundle import verify_bundle
        from stepgap.student.judge import StudentJudge, student_meta
        from stepgap.teacher.nli.onnx import ONNXNLI

        go_offline()
        root = Path(path)
        manifest = verify_bundle(root)
        student = manifest["student"]
        judge: JudgeBackend
        if served_judge is not None:
            meta = student_meta(root / student["path"])
            judge = served_judge(bool(meta.get("nli_features", False)))
        else:
            base = None
            if not student["merged"]:  # carried in the bundle, or a hub id pinned to a commit
                base = (
                    student["base"] if student.get("base_revision") else str(root / student["base"])
                )
            judge = StudentJudge(
                str(root / student["path"]),
                base=base,
                base_revision=student.get("base_revision"),
                device=device,
                dtype=dtype,
                batch_size=batch_size,
                max_new_tokens=max_new_tokens,
            )
        nli = ONNXNLI(
            root / manifest["nli"]["path"],
            precision=nli_precision or manifest["nli"]["default_precision"],
            batch_size=nli_batch_size,
        )
        checker = cls(judge, nli, TreeConfig(**manifest["tree"]))
        checker.manifest = manifest
        return checker
