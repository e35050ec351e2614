"""TRL's `GRPOTrainer` whose tool loop shows each `SearchEnvironment` its rollout's conversation,
so that its searches can be checked as their results come back (typed feedback, `trl.py`).

TRL calls an environment's tools with their arguments only; `StepGapGRPOTrainer` hands each
environment, before the tool loop, the message list TRL grows for its rollout (the assistant
turns and tool messages so far, the same list TRL scores), and changes nothing else.

    trainer = StepGapGRPOTrainer(model=..., reward_funcs=[...], train_dataset=...,
        environment_factory=partial(SearchEnvironment, feedback="typed"), args=GRPOConfig(...))
"""

from __future__ import annotations

from typing import Any

from trl import GRPOTrainer

from .trl import SearchEnvironment


class StepGapGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` for `SearchEnvironment(feedback="typed")` (see the module docstring)."""

    def _tool_call_loop(self, prompts: Any, prompt_ids: Any, completion_ids: Any,
                        completions: Any, *rest: Any) -> Any:  # fmt: skip
        for environment, conversation in zip(self.environments or [], completions, strict=False):
            if isinstance(environment, SearchEnvironment):
                environment.conversation = conversation  # TRL appends to it as the loop goes
        return super()._tool_call_loop(prompts, prompt_ids, completion_ids, completions, *rest)
