"""The distilled student: LoRA/QLoRA SFT on teacher verdicts (`stepgap.student.sft.train`), the
student as a judge, and hard-negative mining (`mine`)."""

from .config import StudentTrainConfig, load_config
from .mining import mine

__all__ = ["StudentTrainConfig", "load_config", "mine"]
