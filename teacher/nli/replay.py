"""Serve stored NLI probabilities, so stored runs can be re-decided without a model."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, model_validator

from stepgap.io import ErrorReport, read_models
from stepgap.options import Options
from stepgap.schema import NLICall, NLIProbs, Verdict
from stepgap.tree import NLIError, Pair

from .base import NLIBackend

Pair_Probs = tuple[Pair, NLIProbs]


class ReplayMissError(ValueError):
    """A replay file asked for an answer it does not hold: a set-up error, not a model failure."""


class ReplayNLI(NLIBackend):
    """Looks pairs up by exact (premise, hypothesis); an unknown pair is an error, not a guess.

    Loaded from a file (`replay:FILE`), a missing pair means the file does not belong to these
    traces, and stops the run (`ReplayMissError`, one line on the command line). Built from the
    verdicts being relabelled, a missing pair fails that step only (`NLIError`).
    """

    name = "replay"

    def __init__(
        self, table: dict[Pair, NLIProbs] | None = None, source: str | None = None
    ) -> None:
        self.table: dict[Pair, NLIProbs] = dict(table or {})
        self.source = source  # the replay file, when missing pairs should stop the run

    @property
    def provenance(self) -> dict[str, str | None]:
        name = Path(self.source).name if self.source else "verdicts"
        return {"spec": f"replay:{name}", "note": "replayed: stored answers, no model ran"}

    @classmethod
    def from_spec(cls, arg: str, options: Options) -> ReplayNLI:
        """`replay:FILE`: the probabilities stored in FILE; it takes no options."""
        return cls.from_file(arg)

    @classmethod
    def from_file(cls, path: str | Path, report: ErrorReport | None = None) -> ReplayNLI:
        """Read NLI replay lines (`{"premise", "hypothesis", "probs"}`) or verdict lines."""
        table: dict[Pair, NLIProbs] = {}
        report = report if report is not None else ErrorReport()
        stored = read_models(
            path, _NLIOrVerdict, report, role="--nli replay file", what="NLI answers or verdicts"
        )
        for _, rec in stored:
            table.update(rec.calls())
        return cls(table, source=str(path))

    @classmethod
    def from_verdicts(cls, verdicts: Iterable[Verdict]) -> ReplayNLI:
        """Every NLI call stored in verdicts, including those kept for ablations (`nli_extra`)."""
        return cls(
            {(c.premise, c.hypothesis): c.probs for v in verdicts for c in [*v.nli, *v.nli_extra]}
        )

    def predict(self, pairs: Sequence[Pair]) -> list[NLIProbs]:
        out = []
        for premise, hypothesis in pairs:
            try:
                out.append(self.table[(premise, hypothesis)])
            except KeyError:
                pair = f"premise {premise[:60]!r} / hypothesis {hypothesis[:60]!r}"
                if self.source is not None:
                    raise ReplayMissError(
                        f"--nli replay:{self.source} has no stored answer for {pair}; a replay "
                        "file answers only the pairs it was recorded with (same traces, judge "
                        "answers and --hypothesis): give a real NLI model (--nli hf:ID_OR_PATH)"
                    ) from None
                raise NLIError(f"no stored NLI output for {pair}") from None
        return out


class _NLIOrVerdict(BaseModel):
    """A replay file line: one NLI record, or a whole verdict carrying its NLI calls."""

    model_config = ConfigDict(extra="allow")

    premise: str | None = None
    hypothesis: str | None = None
    probs: NLIProbs | None = None
    nli: list[NLICall] | None = None

    @model_validator(mode="after")
    def _complete(self) -> _NLIOrVerdict:
        if self.nli is None and (
            self.premise is None or self.hypothesis is None or self.probs is None
        ):
            raise ValueError("needs premise, hypothesis and probs (or a verdict's 'nli' list)")
        return self

    def calls(self) -> list[Pair_Probs]:
        if self.nli is not None:
            return [((c.premise, c.hypothesis), c.probs) for c in self.nli]
        assert self.premise is not None and self.hypothesis is not None and self.probs is not None
        return [((self.premise, self.hypothesis), self.probs)]
