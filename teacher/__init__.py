"""The hybrid teacher checker: an LLM judge for stages A-C, an NLI model for D-E, one tree."""

from .build import CheckerConfig, build_checker
from .checker import Checker, StepChecker
from .judges import JudgeBackend, JudgeRequest, ReplayJudge, build_judge
from .nli import HFNLI, NLIBackend, ReplayNLI, load_nli
from .prompt import PROMPT_VERSION, build_messages, build_requests
from .relabel import RelabelError, group_by_trace, relabel, relabel_file

__all__ = [
    "HFNLI",
    "PROMPT_VERSION",
    "Checker",
    "StepChecker",
    "CheckerConfig",
    "JudgeBackend",
    "JudgeRequest",
    "NLIBackend",
    "RelabelError",
    "ReplayJudge",
    "ReplayNLI",
    "build_checker",
    "build_judge",
    "build_messages",
    "build_requests",
    "group_by_trace",
    "load_nli",
    "relabel",
    "relabel_file",
]
