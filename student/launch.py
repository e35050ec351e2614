"""What a training run needs of its launch (`accelerate launch`, torchrun, or none): the process
state, and resuming from the last checkpoint, for the judge student's trainer and the PRM's."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def process_state() -> Any:
    """accelerate's process state, as the Trainer will see it. Without CUDA the ranks of a
    launch are CPU processes (gloo), which accelerate only recognises when asked for the CPU."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


def _restore_indexed_cpu(storage: Any, location: str) -> Any:
    return storage if location.startswith("cpu:") else None


def accept_indexed_cpu_locations() -> None:
    """Let `torch.load(map_location="cpu:N")` work. A Trainer of several CPU processes (gloo)
    resumes its optimizer with `map_location=args.device`, `cpu:0`, which torch cannot restore;
    on GPUs the location is `cuda:N` and this is not needed. Storage is already on the CPU."""
    import torch

    registered = [entry[2] for entry in torch.serialization._package_registry]
    if _restore_indexed_cpu not in registered:
        torch.serialization.register_package(30, lambda obj: None, _restore_indexed_cpu)


def last_checkpoint(output_dir: str) -> str | None:
    """The last checkpoint-N/ in `output_dir` (what `--resume` continues), or None."""
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None
