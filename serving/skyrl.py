"""Search-R1's search loop as a SkyRL environment (skyrl-gym 0.4), its steps checked while the
episode runs and its reward the typed reward of the whole rollout.

`import stepgap.serving.skyrl` registers `StepGapSearchEnv` in skyrl-gym's registry as
`stepgap_search` (`environment.env_class=stepgap_search`, or the dataset's `env_class`
column); SkyRL's generator then makes one per trajectory, `skyrl_gym.make(env_class,
env_config=..., extras=<the row's other columns>)`, and calls `init(prompt)`, `step(output)`
for each turn, `get_metrics()` and `close()`. Each turn of the policy stops at `</search>` or
`</answer>` (`generator.sampling_params.stop`, as in SkyRL's Search-R1 recipe):

- a search: the query goes to the retriever and its passages come back in `<information>` as
  the observation; the episode's text so far goes to the checker, which checks the step while
  the next turn is generated; the turn's reward is 0.0;
- an answer, the policy's end, or the turn limit (`extras["max_turns"]`, SkyRL's
  `generator.max_turns`): the episode's reward, reusing those answers, is the last turn's;
- neither: Search-R1's note on an invalid action is the observation, and the episode goes on.

Per-turn rewards. SkyRL takes a turn's reward from that turn's `step()` output only (its
generator places it on the turn's last token and never revises it), and a search turn's share
of the typed reward is known only once its step is checked, and in full only at the end (a
step's shaping reads the step before it, EM reads the answer). Waiting for each verdict at
each search would stall every turn for the judge; so every search turn gets 0.0 and the last
turn the whole reward, as SkyRL's own `search` env does with EM: the episode's rewards add up
to the rollout's `StepGapReward.score` reward. The split by turn that the reward holds
(`RewardResult.split_at` at each turn's end) goes in the last turn's `metadata["stepgap"]`.

Settings, from the first place that has them: the env config (SkyRL passes
`environment.skyrl_gym.stepgap_search`, a field of a `SkyRLGymConfig` subclass), the row's
`extras["stepgap"]`, the environment: the checker `url` (`stepgap serve`, replicas
comma-separated; `STEPGAP_REWARD_URL`) or `config` (a reward config file, `{"judge","nli"}` or
`{"bundle"}`; `STEPGAP_REWARD_CONFIG`), else the reward set by `process_reward.configure`; the
retriever `search_url` (`STEPGAP_RETRIEVER_URL`, default http://127.0.0.1:8000/retrieve) and
`topk` (3); `feedback` (`STEPGAP_FEEDBACK`: `typed` sends each search's observation with its
step's note when the verdict comes within `feedback_wait` seconds, `STEPGAP_FEEDBACK_WAIT`,
default 0). The golden answers are `extras["reward_spec"]["ground_truth"]` (SkyRL's Search-R1
data: `{"target": [...]}`), the question `extras["extra_info"]["question"]`, else the prompt's
`Question:` line.

A rollout whose steps could not be checked has no reward: its last `step()` raises
`CheckFailed` (a `skyrl_gym.error.Error`), which fails SkyRL's generation of the batch; it is
never scored 0 or EM. `get_metrics` / `aggregate_metrics` give the batch's label rates, failed
checks, EM, repair rate (`training_logs.reward_logs`) and typed feedback counts, which SkyRL
logs as `environment/stepgap/...`.

This module may be imported by a SkyRL entrypoint in a Ray worker: absolute imports only.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Mapping
from dataclasses import asdict
from typing import Any, TypeVar
from uuid import uuid4

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType
from skyrl_gym.envs.registration import register, registry
from skyrl_gym.error import Error as SkyRLGymError
from skyrl_gym.metrics import default_aggregate_metrics

from stepgap.data_builders.retrieval import RetrievalError, search_passages, tool_retriever
from stepgap.data_builders.rollout_formats import (
    INFORMATION,
    INVALID_ACTION,
    SearchR1Format,
    cut_turn,
)
from stepgap.feedback import Told, check_mode, feedback_logs
from stepgap.reward_arithmetic import RewardResult
from stepgap.serving.framework_inputs import golden_list, question_from_prompt
from stepgap.serving.inline import InlineChecker, inline_checker, result_of
from stepgap.serving.reward_function import available
from stepgap.serving.training_logs import reward_logs
from stepgap.tags import first_block

ENV_ID = "stepgap_search"
STOPS = SearchR1Format.stops
RESULT_KEY = "stepgap/result"  # an episode's RewardResult (JSON form) in its metrics
SETTINGS = ("url", "config", "search_url", "topk", "feedback", "feedback_wait")
ENVIRON = {"url": "STEPGAP_REWARD_URL", "config": "STEPGAP_REWARD_CONFIG",
           "search_url": "STEPGAP_RETRIEVER_URL", "topk": "STEPGAP_RETRIEVER_TOPK",
           "feedback": "STEPGAP_FEEDBACK", "feedback_wait": "STEPGAP_FEEDBACK_WAIT"}  # fmt: skip


class CheckFailed(SkyRLGymError):
    """An episode with no reward (a step check failed): SkyRL's generation of it fails."""


class StepGapSearchEnv(BaseTextEnv):
    """One SkyRL trajectory: Search-R1's turns, each search's step sent to the checker as its
    passages come back, the typed reward on the last turn (see the module docstring)."""

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        extras = dict(extras or {})
        settings = _settings(env_config, extras)
        self.max_turns = int(extras.get("max_turns") or 4)
        self.golden = _golden(extras)
        info = extras.get("extra_info")
        self.question = str(info.get("question") or "") if isinstance(info, Mapping) else ""
        self.retriever = tool_retriever(settings.get("search_url"))
        self.topk = int(settings.get("topk") or 3)
        self.checker: InlineChecker = inline_checker(settings.get("url"), settings.get("config"))
        self.feedback = check_mode(str(settings.get("feedback") or "none"))
        self.feedback_wait = float(settings.get("feedback_wait") or 0)
        self.trace_id = uuid4().hex
        self.response = ""  # the rollout's text: turns and observations, not the invalid notes
        self.turn_ends: list[int] = []  # where each turn (its action and observation) ends
        self.told: list[Told] = []
        self.result: RewardResult | None = None

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        if not self.question:
            self.question = question_from_prompt(prompt)
        return prompt, {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        self.response += action
        block = first_block(cut_turn(action, STOPS)[0], ("search", "answer"))
        going_on = self.turns < self.max_turns
        if block is not None and block[0] == "search" and going_on:
            observation = self._checked(self._search(block[1].strip()))
            return self._going_on(observation, {"search": block[1].strip()})
        if block is None and going_on and _stopped_at_stop(action):
            self.turn_ends.append(len(self.response))  # the note is not the rollout's text
            return self._going_on(INVALID_ACTION, {"invalid_action": True})
        self.turn_ends.append(len(self.response))
        return self._finished()

    def _search(self, query: str) -> str:
        try:
            return INFORMATION.format(search_passages(self.retriever, query, self.topk).strip())
        except RetrievalError as exc:
            return INFORMATION.format(f"search failed: {exc}")

    def _checked(self, information: str) -> str:
        """The observation of a search: its passages, sent to the checker with the text so far;
        with typed feedback, followed by its step's note when the note came in time."""
        text = self.response + information
        if self.feedback == "none":
            _run(self.checker.send(self.trace_id, self.question, text))
            observation = information
        else:
            told = _run(self.checker.tell(self.trace_id, self.question, text, self.feedback_wait))
            self.told.append(told)
            observation = information if told.note is None else f"{information}{told.note}\n\n"
        self.response += observation
        self.turn_ends.append(len(self.response))
        return observation

    @staticmethod
    def _going_on(observation: str, metadata: dict[str, Any]) -> BaseTextEnvStepOutput:
        return BaseTextEnvStepOutput(
            observations=[{"role": "user", "content": observation}],
            reward=0.0,
            done=False,
            metadata=metadata,
        )

    def _finished(self) -> BaseTextEnvStepOutput:
        """The last turn: the whole rollout's reward, or `CheckFailed`."""
        try:
            result = _run(
                self.checker.finalize(self.trace_id, self.question, self.response, self.golden)
            )
            reward = available(result)
        except Exception as exc:  # no reward (RewardUnavailable), or the checker unreachable
            raise CheckFailed(
                f"stepgap: episode {self.trace_id} has no reward ({exc}); it is not scored 0: "
                "fix the checker (its judge, NLI or `stepgap serve`) and rerun the step"
            ) from exc
        self.result = result
        turns = result.split_at(self.turn_ends)
        metadata = {"stepgap": {**result.scalars(), "trace_id": self.trace_id,
                                "turn_rewards": turns}}  # fmt: skip
        return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata=metadata)

    def get_metrics(self) -> dict[str, Any]:
        """The episode's reward in full (for `aggregate_metrics`) and its feedback counts."""
        if self.result is None:
            return {}
        told = _prefixed(feedback_logs(self.told, self.feedback))
        return {RESULT_KEY: asdict(self.result), **told}  # JSON, as SkyRL may dump it

    @staticmethod
    def aggregate_metrics(metrics: list[dict[str, Any]]) -> dict[str, Any]:
        """The batch's `reward_logs` (label rates, failed checks, EM, repair rate, over all its
        episodes' steps) and the means of the episodes' other numbers."""
        results = [result_of(m[RESULT_KEY]) for m in metrics if RESULT_KEY in m]
        return {**default_aggregate_metrics(metrics), **reward_logs(results, prefix="stepgap/")}

    def close(self) -> None:
        if self.result is None:  # ended early (SkyRL's length limit): its steps are not needed
            _run(self.checker.drop(self.trace_id))


def _settings(env_config: Any, extras: Mapping[str, Any]) -> dict[str, Any]:
    """Each setting from the env config, else `extras["stepgap"]`, else the environment; the
    checker's `url` and `config` both from the first of them that gives either."""
    row = extras.get("stepgap") or {}
    if not isinstance(row, Mapping):
        raise ValueError(f"extras['stepgap'] must be a mapping of {', '.join(SETTINGS)}")
    unknown = sorted(set(row) - set(SETTINGS))
    if unknown:
        raise ValueError(f"extras['stepgap'] has unknown keys {unknown}; known: {SETTINGS}")
    sources = [{k: _config_value(env_config, k) for k in SETTINGS}, row,
               {k: os.environ.get(v) for k, v in ENVIRON.items()}]  # fmt: skip
    out: dict[str, Any] = {}
    for keys in (("url", "config"), *((k,) for k in SETTINGS[2:])):  # the checker: one source
        given = next((s for s in sources if any(s.get(k) not in (None, "") for k in keys)), {})
        out.update({k: given.get(k) or None for k in keys})
    return out


def _config_value(env_config: Any, key: str) -> Any:
    """`key` of SkyRL's env config: a mapping (DictConfig, dict) or a dataclass."""
    if env_config is None:
        return None
    if isinstance(env_config, Mapping) or hasattr(env_config, "get"):
        return env_config.get(key)
    return getattr(env_config, key, None)


def _golden(extras: Mapping[str, Any]) -> list[str]:
    spec = extras.get("reward_spec")
    if not isinstance(spec, Mapping) or "ground_truth" not in spec:
        raise ValueError(
            "stepgap_search needs the golden answers in the row's reward_spec.ground_truth "
            "(SkyRL's Search-R1 data has them there)"
        )
    return golden_list(spec["ground_truth"])


def _stopped_at_stop(action: str) -> bool:
    """The turn ended at a stop string (else the policy stopped for good: EOS or no budget)."""
    return any(action.rstrip().endswith(s) for s in STOPS)


def _prefixed(logs: dict[str, float]) -> dict[str, float]:
    return {f"stepgap/{k}": v for k, v in logs.items()}


# SkyRL calls `step` from a thread of its env pool, or on its event loop when
# `max_env_workers` is 0: the checker's coroutines run on a loop of their own.
_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()
T = TypeVar("T")


def _run(work: Coroutine[Any, Any, T]) -> T:
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="stepgap-skyrl", daemon=True).start()
    return asyncio.run_coroutine_threadsafe(work, _LOOP).result()


def register_env(env_id: str = ENV_ID) -> None:
    """Register `StepGapSearchEnv` in skyrl-gym's registry as `env_id` (again: a no-op)."""
    if env_id not in registry:
        register(id=env_id, entry_point="stepgap.serving.skyrl:StepGapSearchEnv")


register_env()
