"""veRL's multi-turn tool agent loop with each step checked while the rollout runs.

- `SearchTool`: Search-R1's retriever as veRL's `search` tool (`BaseTool`): the query goes to
  the retriever's `POST /retrieve` and the passages come back as Search-R1 writes them
  (`Doc 1(Title: ...) ...`). `stepgap retrieval serve` or Search-R1's own server answers it.
- `StepGapToolAgentLoop` (agent name `stepgap_tool_agent`): veRL's `ToolAgentLoop`. As each
  search result is returned into the rollout, the rollout's text so far goes to the checker,
  and the step it completes is checked while the next turn is generated. When the rollout
  ends the loop asks for its reward, which reuses those answers, and sets it as the
  rollout's score: veRL then skips its own reward function for this rollout.

The text the checker sees is the response's tokens decoded as veRL's reward managers decode
them (`skip_special_tokens=True`), so the steps checked during the rollout are the steps of
the finished response, and the reward is the one `compute_score` would give it.

The checker is `stepgap serve` (`stepgap_url` in the agent loop's config, or
`STEPGAP_REWARD_URL`) or a `StreamingReward` in each agent-loop worker over the reward config
file (`stepgap_config`, or `STEPGAP_REWARD_CONFIG`). Configs, beside this module:
`verl_agent_loop.yaml` (`actor_rollout_ref.rollout.agent.agent_loop_config_path`) and
`verl_search_tool.yaml` (`actor_rollout_ref.rollout.multi_turn.tool_config_path`); README
"Checking while the rollout runs" has the whole command line.

Typed feedback (`stepgap_feedback: typed` in the agent loop's config, default `none`): a search
result goes back inside its tool message with the note for its step (`stepgap.feedback`) when
the step's verdict comes within `stepgap_feedback_wait` seconds (default 0: only one already
in). The tool message is tokenized again with the note by veRL's own context merge; the
rollout's `reward_extra_info` counts the notes sent, the verdicts too late and the seconds
waited (`feedback/*`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from stepgap.data_builders.retrieval import HttpRetriever, RetrievalError, search_passages
from stepgap.data_builders.rollout_formats import SEARCH_TOOL
from stepgap.feedback import Told, check_mode, feedback_logs

from .framework_inputs import golden_list
from .inline import inline_checker
from .reward_function import available
from .verl import question_of

AGENT_NAME = "stepgap_tool_agent"


class SearchTool(BaseTool):
    """Search-R1's retriever as a veRL tool. Config keys: `retrieval_service_url` (the
    retriever, `/retrieve` added when missing), `topk` (3), `timeout` (60 s)."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None):
        schema = tool_schema or OpenAIFunctionToolSchema.model_validate(SEARCH_TOOL)
        super().__init__(config, schema)
        url = config.get("retrieval_service_url")
        if not url:
            raise ValueError(
                f"{type(self).__name__}: set config.retrieval_service_url in the tool config "
                "(the retriever's address, e.g. http://127.0.0.1:8000/retrieve)"
            )
        self.topk = int(config.get("topk", 3))
        self.retriever = HttpRetriever(url, timeout=float(config.get("timeout", 60.0)))

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        query = parameters.get("query")
        if not isinstance(query, str) or not query.strip():
            return ToolResponse(text="search needs a non-empty string 'query'"), 0.0, {}
        try:
            passages = await asyncio.to_thread(
                search_passages, self.retriever, query.strip(), self.topk
            )
        except RetrievalError as exc:
            return ToolResponse(text=f"search failed: {exc}"), 0.0, {}
        return ToolResponse(text=passages), 0.0, {}


def _user_text(raw_prompt: Any) -> str | None:
    """The last user message of the row's chat prompt (the question's `Question:` line)."""
    for message in reversed(list(raw_prompt or [])):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else None
    return None


@register(AGENT_NAME)
class StepGapToolAgentLoop(ToolAgentLoop):
    """`ToolAgentLoop` whose steps are checked as their search results come back, and whose
    rollouts leave with their stepgap reward (see the module docstring)."""

    def __init__(
        self,
        *args: Any,
        stepgap_url: str | None = None,
        stepgap_config: str | None = None,
        stepgap_feedback: str = "none",
        stepgap_feedback_wait: float = 0.0,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("name", None)  # the agent loop config's own key
        super().__init__(*args, **kwargs)
        self.checker = inline_checker(url=stepgap_url, config=stepgap_config)
        self.feedback = check_mode(stepgap_feedback)
        self.feedback_wait = float(stepgap_feedback_wait)
        self.trace_id = ""
        self.question = ""
        self.told: list[Told] = []

    def decoded_response(self, token_ids: list[int]) -> str:
        """The response as veRL's reward managers decode it."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        self.trace_id = uuid4().hex
        self.told = []
        self.question = question_of(kwargs.get("extra_info"), _user_text(kwargs.get("raw_prompt")))
        golden = golden_list((kwargs.get("reward_model") or {}).get("ground_truth"))
        try:
            output = await super().run(sampling_params, **kwargs)
        except BaseException:
            await self.checker.drop(self.trace_id)
            raise
        text = self.decoded_response(output.response_ids)
        result = await self.checker.finalize(self.trace_id, self.question, text, golden)
        output.reward_score = available(result)
        output.extra_fields["reward_extra_info"] = {
            **result.scalars(),
            **feedback_logs(self.told, self.feedback),
        }
        output.extra_fields["stepgap_trace_id"] = self.trace_id
        return output

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        before = _Context.of(agent_data)
        state = await super()._handle_processing_tools_state(agent_data)
        if state != AgentState.GENERATING:
            return state
        # the search results are in the response now
        text = self.decoded_response(agent_data.prompt_ids[before.response_start :])
        if self.feedback == "none":
            await self.checker.send(self.trace_id, self.question, text)
            return state
        told = await self.checker.tell(self.trace_id, self.question, text, self.feedback_wait)
        self.told.append(told)
        if told.note is None:
            return state
        return await self._with_note(agent_data, before, told.note)

    async def _with_note(self, agent_data: AgentData, before: _Context, note: str) -> AgentState:
        """The turn's last tool message with the note at its end, merged again from the context
        before the tools answered, as veRL merges tool messages."""
        last = agent_data.messages[-1]
        if last.get("role") != "tool" or not isinstance(last.get("content"), str):
            return AgentState.GENERATING  # a multimodal answer: no note
        last["content"] = f"{last['content']}\n{note}"
        merged, mask, logprobs = await self.ct_merge_context_msg(
            before.messages, agent_data.messages, before.prompt_ids, before.response_mask,
            before.response_logprobs or None, tools=before.tools,
        )  # fmt: skip
        if len(mask) >= self.response_length:
            return AgentState.TERMINATED
        agent_data.prompt_ids = merged.token_ids
        agent_data.response_mask = mask
        if agent_data.response_logprobs:
            agent_data.response_logprobs = logprobs or []
        return AgentState.GENERATING


@dataclass(frozen=True)
class _Context:
    """A rollout's context as it was before its tools answered."""

    messages: list[dict[str, Any]]
    prompt_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    tools: Any

    @property
    def response_start(self) -> int:
        return len(self.prompt_ids) - len(self.response_mask)

    @classmethod
    def of(cls, agent_data: AgentData) -> _Context:
        return cls(
            list(agent_data.messages),
            list(agent_data.prompt_ids),
            list(agent_data.response_mask),
            list(agent_data.response_logprobs or []),
            agent_data._active_tool_schemas,
        )  # fmt: skip  (set by ToolAgentLoop.run)
