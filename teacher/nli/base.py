"""The NLI interface of stages D and E: premise/hypothesis pairs in, three probabilities out.

Backends return probabilities only. Turning them into a label is the tree's job
(`stepgap.tree.nli_label`), so thresholds can be swept over stored probabilities without running
a model again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from stepgap.schema import NLIProbs
from stepgap.tree import Pair


@runtime_checkable
class NLIBackend(Protocol):
    """Anything that scores (premise, hypothesis) pairs; results align with the input order."""

    name: str

    def predict(self, pairs: Sequence[Pair]) -> list[NLIProbs]: ...
