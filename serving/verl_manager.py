"""The dense (token-level) stepgap reward as a veRL 0.9 reward manager.

veRL's own managers put one score on the last response token. This one puts each step's
bracket (base + shape, times lambda) on the token that ends the step, and EM on the last token,
so GRPO's token-level credit sees where the reasoning broke. The row of `rm_scores` still sums
to the reward of `compute_score`. The question is `extra_info["question"]` when the data has it,
else the `Question:` line of the decoded prompt ids (Search-R1's parquet as it ships).

    reward:
      reward_manager:
        source: importlib
        name: StepGapRewardManager
        module:
          path: pkg://stepgap.serving.verl_manager   # or this file's path
      custom_reward_function:                        # where the checker is (see verl.py)
        path: pkg://stepgap.serving.verl
        name: compute_score
        reward_kwargs: {url: "http://reward-node:8000"}

This module imports veRL at load time (it subclasses veRL's `RewardManagerBase`); the rest of
stepgap never does. Absolute imports only: veRL may load it by file path.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from stepgap.reward_arithmetic import RewardResult
from stepgap.serving.framework_inputs import golden_list
from stepgap.serving.process_reward import get_reward
from stepgap.serving.reward_function import available
from stepgap.serving.verl import question_of

log = logging.getLogger(__name__)

TAGS = ("<search>", "</search>", "<answer>", "</answer>", "<tool_call>", "</tool_call>")


def tags_lost_in_decoding(tokenizer: Any) -> list[str]:
    """Tags the tokenizer marks special: `decode(skip_special_tokens=True)` would drop them."""
    special = set(getattr(tokenizer, "all_special_tokens", []) or [])
    return [t for t in TAGS if t in special]


def token_at_char(tokenizer: Any, ids: list[int], char: int) -> int:
    """The index of the token whose decoded text covers character `char` of `decode(ids)`:
    a binary search over prefix decodes, so it follows the tokenizer's own detokenization
    (merged bytes, dropped special tokens) instead of re-tokenizing the text."""
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(ids[:mid], skip_special_tokens=True)) > char:
            hi = mid
        else:
            lo = mid + 1
    return lo - 1


def dense_rewards(result: RewardResult, tokenizer: Any, ids: list[int]) -> list[list[float]]:
    """`[[token index, value], ...]`: each step's lambda * bracket on the token ending the step,
    EM on the last token."""
    out = []
    for step in result.steps:
        if step.span and step.span[1] > step.span[0] and step.bracket:
            index = token_at_char(tokenizer, ids, step.span[1] - 1)
            out.append([float(index), result.lam * step.bracket])
    if ids and result.em:
        out.append([float(len(ids) - 1), result.em])
    return out


class StepGapRewardManager(RewardManagerBase):
    """veRL reward manager: the stepgap reward, dense over the response's tokens."""

    def __init__(
        self,
        config: Any,
        tokenizer: Any,
        compute_score: Any = None,
        reward_router_address: str | None = None,
        reward_model_tokenizer: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(config, tokenizer, compute_score)
        custom = config.reward.get("custom_reward_function") or {}
        self.settings = dict(custom.get("reward_kwargs") or {})
        lost = tags_lost_in_decoding(tokenizer)
        if lost:
            log.warning(
                "the tokenizer marks %s as special tokens: veRL decodes responses without them, "
                "so those steps cannot be segmented; add them as normal tokens (as Qwen2.5 does)",
                ", ".join(lost),
            )

    def prompt_text(self, item: Any) -> str:
        """The prompt as the policy saw it (left padding dropped): where Search-R1's data keeps
        the question, which veRL does not put in `extra_info`."""
        prompt_ids = item.batch["prompts"]
        mask = item.batch["attention_mask"][: prompt_ids.shape[-1]].bool()
        return self.tokenizer.decode(prompt_ids[mask].tolist(), skip_special_tokens=True)

    async def run_single(self, data: DataProto) -> dict[str, Any]:
        item = data[-1:][0]
        response_ids = item.batch["responses"]
        valid = int(item.batch["attention_mask"][-response_ids.shape[-1] :].sum())
        ids = response_ids[:valid].tolist()
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        extra = dict(item.non_tensor_batch.get("extra_info", None) or {})
        question = question_of(extra, self.prompt_text(item))
        golden = golden_list(item.non_tensor_batch["reward_model"]["ground_truth"])
        reward = get_reward(self.settings)

        def score() -> RewardResult:
            return reward.score([text], [str(question)], [golden])[0]

        result = await self.loop.run_in_executor(None, score)
        available(result)  # RewardUnavailable: the sample has no reward (see serving/verl.py)
        dense = await self.loop.run_in_executor(None, dense_rewards, result, self.tokenizer, ids)
        return {
            "reward_score": {"total": result.reward, "dense": dense},
            "reward_extra_info": result.scalars(),
        }

    @classmethod
    def assemble_rm_scores(cls, data: DataProto, scores: list[Any]) -> torch.Tensor:
        """`rm_scores` with each step's value on its token (plain numbers: the last token)."""
        prompt_length = data.batch["prompts"].size(1)
        valid = data.batch["attention_mask"][:, prompt_length:].sum(dim=1)
        rm_scores = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
        for row, score in enumerate(scores):
            last = max(int(valid[row]) - 1, 0)
            if isinstance(score, dict):
                for index, value in score["dense"]:
                    rm_scores[row, min(int(index), last)] += value
            else:
                rm_scores[row, last] = float(score)
        return rm_scores
