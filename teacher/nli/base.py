"""The NLI interface of stages D and E: premise/hypothesis pairs in, three probabilities out.

Backends return probabilities only. Turning them into a label is the tree's job (`nli_label`),
so thresholds can be swept over stored probabilities without running a model again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from stepgap.schema import NLILabel, NLIProbs

Pair = tuple[str, str]  # (premise, hypothesis)


@runtime_checkable
class NLIBackend(Protocol):
    """Anything that scores (premise, hypothesis) pairs; results align with the input order."""

    name: str

    def predict(self, pairs: Sequence[Pair]) -> list[NLIProbs]: ...


def nli_label(
    probs: NLIProbs, entail_threshold: float = 0.5, contradict_threshold: float = 0.5
) -> NLILabel:
    """docs/contract.md section 3: entailment if p_ent >= t_e, contradiction if p_con >= t_c, else neutral."""
    if probs.entailment >= entail_threshold:
        return "entailment"
    if probs.contradiction >= contradict_threshold:
        return "contradiction"
    return "neutral"


class NLIError(RuntimeError):
    """The NLI stage could not score a pair (missing replay entry, model failure)."""
