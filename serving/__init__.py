"""The typed GRPO process reward in training (its arithmetic, docs/contract.md section 4, is
`stepgap.reward_arithmetic`), steps checked while the rollout runs, its adapters for TRL, veRL and
OpenRLHF, and the reward server. The offline checker of a bundle is `stepgap.export`'s."""

from .reward_function import StepGapReward, reward_file
from .streaming import StreamingReward

__all__ = ["StepGapReward", "StreamingReward", "reward_file"]
