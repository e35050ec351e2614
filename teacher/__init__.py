"""The hybrid teacher checker: an LLM judge for stages A-C, an NLI model for D-E, one tree."""

from stepgap.tree import TreeConfig, decide_trace, hypothesis_for, quote_in_evidence

from .build import CheckerConfig, build_checker, build_judge
from .checker import Checker, StepChecker
from .judges import JudgeBackend, JudgeRequest, JudgeResult, ReplayJudge, load_judge
from .nli import HFNLI, NLIBackend, ReplayNLI, load_nli, nli_label
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
    "JudgeResult",
    "NLIBackend",
    "RelabelError",
    "ReplayJudge",
    "ReplayNLI",
    "TreeConfig",
    "build_checker",
    "build_judge",
    "build_messages",
    "build_requests",
    "decide_trace",
    "group_by_trace",
    "hypothesis_for",
    "load_judge",
    "load_nli",
    "nli_label",
    "quote_in_evidence",
    "relabel",
    "relabel_file",
]
