"""The typed GRPO process reward (SPEC section 4) and its adapters for TRL, veRL and OpenRLHF."""

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
    token_f1,
)

__all__ = [
    "VARIANTS",
    "RewardResult",
    "StepGapReward",
    "StepReward",
    "compute_reward",
    "exact_match",
    "is_near_duplicate",
    "is_retraction",
    "normalize_answer",
    "token_f1",
]
