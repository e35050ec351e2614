"""OpenRLHF's multi-turn agent as Search-R1's search loop, with each step checked while it runs.

`--train.agent_func_path <site-packages>/stepgap/serving/openrlhf_agent.py`: OpenRLHF (0.11)
loads this file and runs `AgentExecutor` (its `MultiTurnAgentExecutor` over
`SearchAgentInstance`) for each prompt. Each turn of the policy stops at `</search>` or
`</answer>`, as in Search-R1:

- a search: the query goes to the retriever, its passages come back in `<information>`, and
  the rollout's text so far goes to the checker, which checks the step while the next turn is
  generated;
- an answer (or the turn limit): the rollout's reward, reusing those answers, is the step's
  reward and ends the rollout;
- neither: Search-R1's note on an invalid action, and the rollout goes on.

Settings come from the environment, since OpenRLHF builds both classes without arguments:
`STEPGAP_RETRIEVER_URL` (the retriever's `/retrieve`, default http://127.0.0.1:8000/retrieve),
`STEPGAP_RETRIEVER_TOPK` (3), `STEPGAP_MAX_TURNS` (4 searches), and the checker as for the
reward: `STEPGAP_REWARD_URL` (`stepgap serve`) or `STEPGAP_REWARD_CONFIG` (a reward config
file; the check then runs in the rollout worker). The label is the golden answers.

Typed feedback (`STEPGAP_FEEDBACK=typed`, default `none`): a search's `<information>` goes back
with the note for its step (`stepgap.feedback`) when the step's verdict comes within
`STEPGAP_FEEDBACK_WAIT` seconds (default 0: only one already in); the rollout's logs count the
notes sent, the verdicts too late and the seconds waited (`feedback/*`).

This module is loaded by file path, so it uses absolute imports only.
"""

from __future__ import annotations

import asyncio
import copy
import os
from typing import Any
from uuid import uuid4

import torch
from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

from stepgap.data_builders.retrieval import RetrievalError, search_passages, tool_retriever
from stepgap.data_builders.rollout_formats import (
    INFORMATION,
    INVALID_ACTION,
    SearchR1Format,
    cut_turn,
)
from stepgap.feedback import Told, check_mode, feedback_logs
from stepgap.serving.framework_inputs import golden_list, question_from_prompt
from stepgap.serving.inline import inline_checker
from stepgap.serving.reward_function import available
from stepgap.tags import first_block

STOPS = SearchR1Format.stops


class SearchAgentInstance(AgentInstanceBase):
    """One rollout: Search-R1's turns, its steps sent to the checker as their results come."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.trace_id = uuid4().hex
        self.checker = inline_checker()
        self.topk = int(os.environ.get("STEPGAP_RETRIEVER_TOPK", "3"))
        self.max_turns = int(os.environ.get("STEPGAP_MAX_TURNS", "4"))
        self.prompt = ""
        self.question = ""
        self.searches = 0
        self.feedback = check_mode(os.environ.get("STEPGAP_FEEDBACK", "none"))
        self.feedback_wait = float(os.environ.get("STEPGAP_FEEDBACK_WAIT", "0"))
        self.told: list[Told] = []

    async def reset(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        self.prompt = states["observation"]
        self.question = question_from_prompt(self.prompt)
        return states

    def response_of(self, text: str) -> str:
        """The rollout's response: its text after the prompt, without the notes on invalid
        actions (the environment's words, whose literal `<search>` would read as a search)."""
        text = text[len(self.prompt) :] if text.startswith(self.prompt) else text
        return text.replace(INVALID_ACTION, "")

    async def step(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        action, _ = cut_turn(states["action_text"], STOPS)
        so_far = states["observation_text"] + states["action_text"]
        block = first_block(action, ("search", "answer"))
        if block is not None and block[0] == "search" and self.searches < self.max_turns:
            self.searches += 1
            try:
                passages = await asyncio.to_thread(
                    search_passages, tool_retriever(), block[1].strip(), self.topk
                )
                feedback = INFORMATION.format(passages.strip())
            except RetrievalError as exc:
                feedback = INFORMATION.format(f"search failed: {exc}")
            return self._going_on(await self._checked(so_far + feedback, feedback))
        if block is None and self.searches < self.max_turns and not _ended(states):
            return self._going_on(INVALID_ACTION)
        return await self._finished(so_far, states["label"])

    async def _checked(self, text: str, feedback: str) -> str:
        """Send the rollout's text so far to the checker; with typed feedback, the search's
        feedback with its step's note when the note came in time."""
        if self.feedback == "none":
            await self.checker.send(self.trace_id, self.question, self.response_of(text))
            return feedback
        told = await self.checker.tell(
            self.trace_id, self.question, self.response_of(text), self.feedback_wait
        )
        self.told.append(told)
        return feedback if told.note is None else f"{feedback}{told.note}\n\n"

    @staticmethod
    def _going_on(feedback: str) -> dict[str, Any]:
        return {
            "rewards": torch.tensor(0.0),
            "scores": 0.0,
            "environment_feedback": feedback,
            "done": False,
        }

    async def _finished(self, text: str, label: Any) -> dict[str, Any]:
        result = await self.checker.finalize(
            self.trace_id, self.question, self.response_of(text), golden_list(label)
        )
        reward = available(result)
        return {
            "rewards": torch.tensor(reward, dtype=torch.float64),  # summed with .item()
            "scores": reward,
            "environment_feedback": "",
            "done": True,
            "extra_logs": {
                **{k: v for k, v in result.scalars().items() if k != "score"},
                **feedback_logs(self.told, self.feedback),
            },
        }


def _ended(states: dict[str, Any]) -> bool:
    """The policy stopped for good (no stop string reached: end of sequence or no budget)."""
    return not any(states["action_text"].rstrip().endswith(s) for s in STOPS)


class AgentExecutor(MultiTurnAgentExecutor):
    """OpenRLHF's multi-turn executor over `SearchAgentInstance`, each turn stopping at
    `</search>` or `</answer>` (Search-R1's stops)."""

    def __init__(self) -> None:
        super().__init__(SearchAgentInstance)

    async def execute(
        self,
        prompt: Any,
        label: Any,
        sampling_params: Any,
        max_length: int,
        hf_tokenizer: Any,
        llm_engine: Any,
        images: Any = None,
    ) -> dict[str, Any]:
        params = copy.deepcopy(sampling_params)
        params.stop = sorted({*(getattr(params, "stop", None) or []), *STOPS})
        params.include_stop_str_in_output = True
        return await super().execute(
            prompt, label, params, max_length, hf_tokenizer, llm_engine, images
        )
