"""Serve stored judge objects by (trace id, step): re-deciding costs no LLM call."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from stepgap.io import ErrorReport, read_models
from stepgap.options import Options
from stepgap.schema import Judge, Verdict
from stepgap.tree import JudgeResult

from .base import JudgeBackend, JudgeRequest, require_judge_schema


class _StoredJudge(BaseModel):
    """A judge replay line, or a verdict line (whose judge may be null when its check failed)."""

    model_config = ConfigDict(extra="allow")

    trace_id: str
    step: int
    judge: Judge | None = None
    judge_confidences: dict[str, float] | None = None


class ReplayJudge(JudgeBackend):
    """Stored judge objects by (trace id, step): re-deciding costs no model call."""

    name = "replay"

    def __init__(
        self, table: dict[tuple[str, int], JudgeResult] | None = None, source: str = "verdicts"
    ) -> None:
        self.table = dict(table or {})
        self.source = source

    @property
    def provenance(self) -> dict[str, str | None]:
        """Replayed answers: recorded earlier (by a model, or by hand), no model ran now."""
        return {"spec": f"replay:{self.source}", "note": "replayed: stored answers, no model ran"}

    @classmethod
    def from_spec(cls, arg: str, options: Options, *, online: bool = False) -> ReplayJudge:
        """`replay:FILE`: the answers stored in FILE; it takes no options."""
        return cls.from_file(arg)

    @classmethod
    def from_file(cls, path: str | Path, report: ErrorReport | None = None) -> ReplayJudge:
        """Read `{"trace_id", "step", "judge"}` lines; verdict files work too."""
        table = {}
        stored = read_models(
            path, _StoredJudge, report, role="--judge replay file", what="judge answers or verdicts"
        )
        for _, rec in stored:
            if rec.judge is not None:
                table[(rec.trace_id, rec.step)] = JudgeResult(
                    judge=rec.judge, confidences=dict(rec.judge_confidences or {})
                )
        return cls(table, source=Path(path).name)

    @classmethod
    def from_verdicts(cls, verdicts: Iterable[Verdict]) -> ReplayJudge:
        return cls(
            {
                (v.trace_id, v.step): JudgeResult(
                    judge=v.judge, confidences=dict(v.judge_confidences or {})
                )
                for v in verdicts
                if v.judge is not None
            }
        )

    def judge(
        self, requests: Sequence[JudgeRequest], *, stop: threading.Event | None = None
    ) -> list[JudgeResult]:
        require_judge_schema(self.name, requests)
        return [
            self.table.get((r.trace_id, r.step))
            or JudgeResult.failed(f"no stored judge output for trace {r.trace_id!r} step {r.step}")
            for r in requests
        ]
