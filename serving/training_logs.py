"""What every trainer adapter logs about a batch of rewards, in one set of names: the rate of each
label among the checked steps, the failed checks, the unsegmented responses, the rollouts with no
reward, EM and the repair rate. Each adapter hands them to its trainer's own metrics (TRL's
`log_metric`, verifiers' metrics, SkyRL's and AReaL's stats) under its prefix."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from stepgap.reward_arithmetic import RewardResult

LABELS = ("no_gap", "CC", "IE", "MB")


def reward_logs(results: Sequence[RewardResult], prefix: str = "stepgap/") -> dict[str, float]:
    """The batch's means: `rate_<label>` and `failed_checks` over its steps, `unsegmented`,
    `no_reward` and `em` over its rollouts, `repair_rate` over the steps after a gap."""
    counts = Counter(s.label for r in results for s in r.steps)
    steps = sum(counts.values())
    out = {f"rate_{lab}": counts.get(lab, 0) / steps if steps else 0.0 for lab in LABELS}
    n = len(results)
    out["failed_checks"] = sum(r.failed_checks for r in results) / steps if steps else 0.0
    out["unsegmented"] = sum(r.unsegmented for r in results) / n if n else 0.0
    out["no_reward"] = sum(r.reward is None for r in results) / n if n else 0.0
    out["em"] = sum(r.em for r in results) / n if n else 0.0
    repairs = [r.repairs() for r in results]  # (steps after a gap, those that repaired it)
    chances = sum(c for c, _ in repairs)
    out["repair_rate"] = sum(m for _, m in repairs) / chances if chances else 0.0
    return {f"{prefix}{k}": v for k, v in out.items()}
