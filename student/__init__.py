"""The distilled student: LoRA/QLoRA SFT on teacher verdicts (`stepgap.student.trainer.train`), the
student as a judge, and hard-negative mining (`mine`)."""

from . import judge  # noqa: F401 - registers the `student:PATH` judge
from .mining import mine
from .recipe import Recipe, StudentArguments, load_config

__all__ = ["Recipe", "StudentArguments", "load_config", "mine"]
