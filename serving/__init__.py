"""The typed GRPO process reward in training (its arithmetic, docs/contract.md section 4, is
`stepgap.reward_arithmetic`, re-exported here), steps checked while the rollout runs, its adapters for TRL, veRL and OpenRLHF, the reward server,
and the offline checker loaded from an exported bundle."""

from stepgap.reward_arithmetic import (
    VARIANTS,
    RewardResult,
    StepReward,
    compute_reward,
    exact_match,
    is_near_duplicate,
    is_retraction,
    normalize_answer,
    token_f1,
)

from .offline import OfflineChecker
from .reward_function import StepGapReward, reward_file
from .streaming import StreamingReward

__all__ = [
    "OfflineChecker",
    "VARIANTS",
    "RewardResult",
    "StepGapReward",
    "StepReward",
    "StreamingReward",
    "compute_reward",
    "exact_match",
    "is_near_duplicate",
    "is_retraction",
    "normalize_answer",
    "reward_file",
    "token_f1",
]
