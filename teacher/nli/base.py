"""The NLI interface of stages D and E: premise/hypothesis pairs in, three probabilities out.

Backends return probabilities only. Turning them into a label is the tree's job
(`stepgap.tree.nli_label`), so thresholds can be swept over stored probabilities without running
a model again.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from stepgap.options import Options, option
from stepgap.registry import Backend
from stepgap.schema import NLIProbs
from stepgap.tree import Pair

#: the group of the NLI model's flags in `--help`
NLI_GROUP = "NLI (stages D-E)"


@dataclass(frozen=True)
class NLIOptions(Options):
    """The options of an NLI model that runs here: where."""

    device: str | None = option(
        None, "NLI device (cpu, cuda, cuda:1; default auto)", group=NLI_GROUP
    )


class NLIBackend(Backend):
    """Scores (premise, hypothesis) pairs; `predict` is the one method a backend must write.
    A spec `KIND:ARG` builds it with `from_spec` (`cls(ARG, options)` by default), its options
    an instance of its `options_class` (none by default)."""

    #: the spec kind (`hf`, `onnx`, `replay`), also the default provenance
    name: str = "nli"

    @abstractmethod
    def predict(self, pairs: Sequence[Pair]) -> list[NLIProbs]:
        """Probabilities per pair, aligned with the input order; a pair it cannot score raises
        `stepgap.tree.NLIError` (the checker then scores the others alone)."""

    @classmethod
    def from_spec(cls, arg: str, options: Options) -> NLIBackend:
        """The NLI model a spec `KIND:ARG` names, with its options; `cls(arg, options)` by
        default."""
        return cls(arg, options)  # type: ignore[call-arg]

    @property
    def provenance(self) -> dict[str, str | None]:
        """What a verdict records of this model (`Verdict.checker`): its spec and a note."""
        return {"spec": self.name, "note": None}
