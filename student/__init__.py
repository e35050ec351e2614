"""The distilled student: LoRA/QLoRA SFT on teacher verdicts (`stepgap.student.trainer.train`), the
student as a judge, and hard-negative mining (`mine`)."""

from .mining import mine
from .recipe import StudentTrainConfig, load_config

__all__ = ["StudentTrainConfig", "load_config", "mine"]
