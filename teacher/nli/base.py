"""The NLI interface of stages D and E: premise/hypothesis pairs in, three probabilities out.

Backends return probabilities only. Turning them into a label is the tree's job
(`stepgap.tree.nli_label`), so thresholds can be swept over stored probabilities without running
a model again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from stepgap.schema import NLIProbs
from stepgap.tree import Pair


class NLIBackend(ABC):
    """Scores (premise, hypothesis) pairs; `predict` is the one method a backend must write."""

    #: the spec kind (`hf`, `onnx`, `replay`), also the default provenance
    name: str = "nli"

    @abstractmethod
    def predict(self, pairs: Sequence[Pair]) -> list[NLIProbs]:
        """Probabilities per pair, aligned with the input order; a pair it cannot score raises
        `stepgap.tree.NLIError` (the checker then scores the others alone)."""

    @property
    def provenance(self) -> dict[str, str | None]:
        """What a verdict records of this model (`Verdict.checker`): its spec and a note."""
        return {"spec": self.name, "note": None}
