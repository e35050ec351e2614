"""The distilled student: LoRA/QLoRA SFT on teacher verdicts, and the student as a judge."""

from .config import StudentTrainConfig, load_config

__all__ = ["StudentTrainConfig", "load_config"]
