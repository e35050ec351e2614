"""A stepgap search environment in verifiers' own terms (verifiers 0.4, `verifiers.v1`).

verifiers finds an environment by its taskset id: `vf-eval stepgap-search` imports the module
`stepgap_search` (environments/stepgap_search, a re-export of this one) and takes the `Taskset`,
`Harness` and `Env` it exports in `__all__`. What each one is:

- `StepgapSearchTaskset` (`--env.taskset.*`): the questions of a QA file (`qa`: JSONL with
  `question` and `golden_answers`, any layout `stepgap rollouts` reads), each a task whose prompt
  is Search-R1's, in its tool-calling form (`HERMES_TEMPLATE`);
- `StepgapSearchTask` (`--env.taskset.task.*`): the `search` tool over a retriever
  (`retriever_url`, `topk`, `max_turns`), and the typed stepgap reward of the whole rollout
  (its messages -> `text_of` -> `StepGapReward.score`), from `stepgap serve` (`url`), a reward
  config file (`config`: a judge and NLI, or `{"bundle": ...}`), else `STEPGAP_REWARD_URL` /
  `STEPGAP_REWARD_CONFIG` / `process_reward.configure`. Each search's step is sent to the
  checker as its result comes back, and its answer is reused by the reward. A reward that is
  not configured stops the run when the taskset loads, before any rollout;
- `StepgapSearchHarness`: the agent's loop, run in this process (verifiers' `Harness.launch`
  allows it when every model call goes through the rollout's interception endpoint, as here):
  chat completions with the `search` tool, each call answered by the task's tool;
- `StepgapSearchEnv`: one agent seat, on the subprocess runtime by default (the loop runs no
  code of the model's; no sandbox is needed).

A rollout whose steps could not all be checked has no reward: the reward function raises, and
verifiers records the rollout as errored (`trace.ok` false, its `TaskError` in `trace.errors`,
`trace.rewards["stepgap"]` None), never a 0. The metrics (`trace.metrics`, `stepgap/*`) are
`reward_logs` of the rollout (label rates, failed checks, no_reward, EM, repair rate), recorded
for an errored rollout too. verifiers 0.4 has no per-turn rewards (its rewards are named
scalars summed into `trace.reward`); the reward cut at each turn's end (`RewardResult.split_at`)
is kept in `trace.info["stepgap"]["turn_rewards"]` for a trainer that wants it.

Typed feedback (`--env.taskset.task.feedback typed`, else `STEPGAP_FEEDBACK`): a search's tool
response carries the note for its step (`stepgap.feedback`) when its verdict comes within
`feedback_wait` seconds (`STEPGAP_FEEDBACK_WAIT`, default 0: only one already in).

Needs `verifiers>=0.4,<0.5` beside `stepgap[teacher,serve,retrieval]`; absolute imports only.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterable
from typing import Any, Literal

import verifiers.v1 as vf
from pydantic import ConfigDict, Field

from stepgap.data_builders.qa import iter_questions
from stepgap.data_builders.retrieval import RetrievalError, search_passages, tool_retriever
from stepgap.data_builders.rollout_formats import HERMES_TEMPLATE, SEARCH_TOOL, question_text
from stepgap.feedback import Told, check_mode, feedback_logs
from stepgap.reward_arithmetic import RewardResult
from stepgap.serving.framework_inputs import text_of
from stepgap.serving.inline import InlineChecker, inline_checker
from stepgap.serving.process_reward import get_reward
from stepgap.serving.reward_function import available
from stepgap.serving.training_logs import reward_logs

REWARD_NAME = "stepgap"


class StepgapSearchTaskConfig(vf.TaskConfig):
    """The search tool and the reward (`--env.taskset.task.*`)."""

    retriever_url: str | None = None
    """The retriever's /retrieve (`stepgap serve-index`, or Search-R1's own); else
    `STEPGAP_RETRIEVER_URL`, else http://127.0.0.1:8000/retrieve."""
    topk: int = Field(3, ge=1)
    """Passages a search returns."""
    max_turns: int = Field(4, ge=0)
    """Searches a rollout may make; then the model is asked for its answer without the tool."""
    url: str | None = None
    """`stepgap serve` (comma-separated replicas) that checks the steps and gives the reward."""
    config: str | None = None
    """A reward config file (JSON/YAML: `{"judge", "nli"}` or `{"bundle"}`) checked here."""
    feedback: Literal["none", "typed"] | None = None
    """`typed`: each search's tool response carries its step's note; else `STEPGAP_FEEDBACK`."""
    feedback_wait: float | None = Field(None, ge=0)
    """Seconds a search waits for its step's verdict; else `STEPGAP_FEEDBACK_WAIT` (0)."""


class StepgapSearchData(vf.TaskData):
    """One question: its text and golden answers (the prompt is Search-R1's)."""

    question: str
    golden_answers: list[str] = Field(default_factory=list)


class SearchTool:
    """One rollout's `search`: the retriever's passages, its step sent to the checker (with
    typed feedback, the step's note after the passages when its verdict came in time)."""

    def __init__(self, config: StepgapSearchTaskConfig, question: str, trace_id: str) -> None:
        self.retriever = tool_retriever(config.retriever_url)
        self.topk = config.topk
        self.max_turns = config.max_turns
        self.question = question
        self.trace_id = trace_id
        self.checker = checker_of(config)
        self.feedback = check_mode(config.feedback or os.environ.get("STEPGAP_FEEDBACK", "none"))
        wait = config.feedback_wait
        self.wait = float(os.environ.get("STEPGAP_FEEDBACK_WAIT", "0") if wait is None else wait)
        self.told: list[Told] = []

    async def __call__(self, query: str, conversation: list[dict[str, Any]]) -> str:
        """The tool message's content for `query`; `conversation` is the rollout's completion
        so far (assistant turns and tool messages), ending with the call being answered."""
        try:
            passages = await asyncio.to_thread(search_passages, self.retriever, query, self.topk)
        except RetrievalError as exc:  # the model reads it, as Search-R1's agent loops do
            passages = f"search failed: {exc}"
        tool = {"role": "tool", "name": "search", "content": passages}
        text = text_of([*conversation, tool])
        if self.feedback == "none":
            await self.checker.send(self.trace_id, self.question, text)
            return passages
        told = await self.checker.tell(self.trace_id, self.question, text, self.wait)
        self.told.append(told)
        return passages if told.note is None else f"{passages}\n{told.note}"


NOT_CONFIGURED = (
    "the stepgap reward is not configured: give --env.taskset.task.url (a `stepgap serve`) or "
    "--env.taskset.task.config FILE (a reward config), or set STEPGAP_REWARD_URL or "
    "STEPGAP_REWARD_CONFIG"
)


def checker_of(config: StepgapSearchTaskConfig) -> InlineChecker:
    """This process's inline checker for the task's reward settings."""
    given = config.url or config.config
    if not (
        given or os.environ.get("STEPGAP_REWARD_URL") or os.environ.get("STEPGAP_REWARD_CONFIG")
    ):
        try:
            get_reward()  # one set by `process_reward.configure`
        except RuntimeError:
            raise ValueError(NOT_CONFIGURED) from None
    return inline_checker(url=config.url, config=config.config)


class SearchState(vf.State):
    """The rollout's live tool and result, shared by the task and the harness (not traced)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    tool: Any = Field(None, exclude=True)
    result: Any = Field(None, exclude=True)


def completion_of(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """The rollout's completion as chat dicts: its messages after the prompt (the leading
    system and user messages)."""
    plain = [m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in messages]
    start = 0
    while start < len(plain) and plain[start].get("role") in ("system", "user"):
        start += 1
    return plain[start:]


def turn_ends(completion: list[dict[str, Any]]) -> list[int]:
    """Where each assistant turn ends in `text_of(completion)` (character positions)."""
    full = text_of(completion) if completion else ""
    ends = []
    for i, m in enumerate(completion):
        if m.get("role") == "assistant":
            so_far = text_of(completion[: i + 1])
            if full.startswith(so_far) and (not ends or len(so_far) >= ends[-1]):
                ends.append(len(so_far))
    return ends


class StepgapSearchTask(vf.Task[StepgapSearchData, SearchState, StepgapSearchTaskConfig]):
    """A question, the `search` tool, and the typed stepgap reward of the rollout."""

    async def setup(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        trace.state.tool = SearchTool(self.config, self.data.question, trace.id)

    async def result(self, trace: vf.Trace) -> RewardResult:
        """The rollout's reward result (once a trace), reusing the answers made while it ran."""
        if trace.state.result is None:
            completion = completion_of(trace.messages)
            text = text_of(completion) if completion else ""
            result = await checker_of(self.config).finalize(
                trace.id, self.data.question, text, self.data.golden_answers
            )
            info: dict[str, Any] = {"unavailable": result.unavailable}
            ends = turn_ends(completion)
            if result.reward is not None and ends:
                info["turn_rewards"] = result.split_at(ends)
            trace.info[REWARD_NAME] = info
            trace.state.result = result
        return trace.state.result

    @vf.metric
    async def stepgap_logs(self, trace: vf.Trace) -> dict[str, float]:
        """`reward_logs` of the rollout, with its typed feedback counts."""
        tool = trace.state.tool
        told = feedback_logs(tool.told, tool.feedback) if isinstance(tool, SearchTool) else {}
        logs = reward_logs([await self.result(trace)])
        return {**logs, **{f"stepgap/{k}": v for k, v in told.items()}}

    @vf.reward
    async def stepgap(self, trace: vf.Trace) -> float:
        """The typed reward; a rollout with a failed check raises (no reward, never 0)."""
        return available(await self.result(trace))


class StepgapSearchConfig(vf.TasksetConfig):
    """The QA file (`--env.taskset.*`); the tool and reward are under `task`."""

    qa: str = ""
    """JSONL / JSON / Parquet of questions with `question` and `golden_answers`."""
    columns: str | None = None
    """`stepgap rollouts --columns`: where the fields are, when not at their usual names."""
    task: StepgapSearchTaskConfig = StepgapSearchTaskConfig()


class StepgapSearchTaskset(vf.Taskset[StepgapSearchTask, StepgapSearchConfig]):
    """One task per question of the QA file, with Search-R1's tool-calling prompt."""

    def load(self) -> list[StepgapSearchTask]:
        if not self.config.qa:
            raise ValueError(
                "the stepgap-search taskset needs its questions: --env.taskset.qa FILE"
            )
        checker_of(self.config.task)  # a reward that cannot be built fails the run, at once
        return [
            StepgapSearchTask(
                StepgapSearchData(
                    id=item.id,
                    prompt=HERMES_TEMPLATE.format(question=question_text(item.question)),
                    question=item.question,
                    golden_answers=item.golden_answers,
                ),
                self.config.task,
            )
            for item in iter_questions(self.config.qa, columns=self.config.columns)
        ]


class StepgapSearchHarnessConfig(vf.HarnessConfig):
    """The in-process search loop; the tool's settings are the task's."""


class StepgapSearchHarness(vf.Harness[StepgapSearchHarnessConfig]):
    """The agent's loop in this process: chat completions through the rollout's interception
    endpoint with the `search` tool, each tool call answered by the task's `SearchTool`,
    until a turn calls no tool; after `max_turns` searches, one last turn without the tool."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data):
        from openai import AsyncOpenAI

        tool = trace.state.tool
        if not isinstance(tool, SearchTool):
            raise vf.HarnessError(
                "the stepgap-search harness runs stepgap-search tasks only (no search tool "
                "on this rollout): pair it with --env.taskset.id stepgap-search"
            )
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [m.model_dump(exclude_none=True) for m in prompt or []]
        start = len(messages)
        async with AsyncOpenAI(base_url=endpoint, api_key=secret) as client:
            for turn in range(tool.max_turns + 1):
                tools = [SEARCH_TOOL] if turn < tool.max_turns else None
                reply = await client.chat.completions.create(
                    model=ctx.model, messages=messages, **({"tools": tools} if tools else {})
                )
                message = reply.choices[0].message.model_dump(exclude_none=True)
                messages.append(message)
                if not message.get("tool_calls"):
                    break
                for call in message["tool_calls"]:
                    answer = await self._answer(tool, call, messages[start:])
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": answer})
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")

    @staticmethod
    async def _answer(tool: SearchTool, call: dict[str, Any], completion: list[dict]) -> str:
        function = call.get("function") or {}
        try:
            query = json.loads(function.get("arguments") or "{}").get("query")
        except (json.JSONDecodeError, AttributeError):
            query = None
        if function.get("name") != "search" or not isinstance(query, str):
            return 'error: the only tool is search, called with {"query": "..."}'
        return await tool(query.strip(), completion)


class StepgapSearchEnvConfig(vf.EnvConfig):
    """One agent seat (`--env.agent.*`), on the subprocess runtime unless told otherwise."""

    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())


class StepgapSearchEnv(vf.Env[StepgapSearchEnvConfig]):
    """The single agent playing each question."""

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        await agents.agent.run(task)


TASK_KEYS = tuple(
    k for k in StepgapSearchTaskConfig.model_fields if k not in vf.TaskConfig.model_fields
)


def load_environment(qa: str, *, columns: str | None = None, **kwargs: Any) -> vf.Env:
    """The environment through verifiers' own loader (`vf.load_environment`), from keyword
    arguments: `qa` (the QA file), `columns`, and the task's settings (`retriever_url`, `topk`,
    `max_turns`, `url`, `config`, `feedback`, `feedback_wait`). Needs `stepgap_search`
    importable (`pip install ./environments/stepgap_search`): verifiers loads by that name."""
    unknown = sorted(set(kwargs) - set(TASK_KEYS))
    if unknown:
        raise TypeError(f"load_environment: unknown settings {unknown}; known: {list(TASK_KEYS)}")
    taskset = {"id": "stepgap-search", "qa": str(qa), "columns": columns, "task": kwargs}
    return vf.load_environment(vf.resolve_env_config({"taskset": taskset}))


__all__ = [
    "StepgapSearchConfig",
    "StepgapSearchData",
    "StepgapSearchEnv",
    "StepgapSearchEnvConfig",
    "StepgapSearchHarness",
    "StepgapSearchHarnessConfig",
    "StepgapSearchTask",
    "StepgapSearchTaskConfig",
    "StepgapSearchTaskset",
    "load_environment",
]
