"""The typed GRPO process reward (docs/contract.md, section 4), its adapters for TRL, veRL and OpenRLHF, and
the offline checker loaded from an exported bundle."""

from .offline import OfflineChecker
from .reward import (
    VARIANTS,
    RewardResult,
    StepGapReward,
    StepReward,
    compute_reward,
    exact_match,
    is_near_duplicate,
    is_retraction,
    normalize_answer,
    reward_file,
    token_f1,
)

__all__ = [
    "OfflineChecker",
    "VARIANTS",
    "RewardResult",
    "StepGapReward",
    "StepReward",
    "compute_reward",
    "exact_match",
    "is_near_duplicate",
    "is_retraction",
    "normalize_answer",
    "reward_file",
    "token_f1",
]
