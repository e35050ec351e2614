"""The stepgap reward for AReaL (1.0.4), in AReaL's own terms: a reward function
`reward_fn(prompt, completions, prompt_ids, completion_ids, **data)` that its
`AsyncRewardWrapper` runs in a process pool, as `RLVRWorkflow` and `MultiTurnWorkflow` call it.

    from stepgap.serving.areal import AReaLReward, StepGapRLVRWorkflow
    workflow = StepGapRLVRWorkflow(AReaLReward(url="http://reward-node:8000"), gconfig, tokenizer)

or, in AReaL's own workflow, the function by name: `RLVRWorkflow("stepgap.serving.areal.reward_fn",
...)`, the checker then from the environment: `STEPGAP_REWARD_URL` (a `stepgap serve`;
comma-separated replicas) or `STEPGAP_REWARD_CONFIG` (a JSON/YAML reward config), built once per
worker process (`process_reward.get_reward`). A config (the checker in AReaL's processes)
needs transformers 5.4 or newer, above AReaL 1.0.4's ceiling (5.3, whose DeBERTa tokenizer
drops the NLI pairs' [CLS]/[SEP]), so in AReaL's venv the checker is a `stepgap serve`.
This module is loaded by that string path in AReaL's worker processes, so it uses absolute
imports only and imports no AReaL code until `StepGapRLVRWorkflow` is asked for.

The question is the row's `question`, else the prompt's `Question:` line (Search-R1's
template); the golden answers are its `golden_answers`, else its `answer`.

What AReaL makes of a reward function, and what this one does about it:

- A failed check is never a number: the rollout has no reward, and the function raises
  `RewardUnavailable` naming why. AReaL retries it (`max_retries`), then its workflow raises and
  AReaL's executor drops that rollout (counted in its `rollout/rejected`), its own "no reward".
- AReaL turns a call that outlasts its `timeout_seconds` (15 s, fixed in `RLVRWorkflow`), or that
  raises any `TimeoutError`, into a reward of 0. So this function sizes its own wait below that
  timeout (`wait_budget`): it sends the server that deadline (`X-Stepgap-Timeout`, through
  `RemoteChecker`'s timeout), so a server that cannot check in time answers 503 and the function
  raises before AReaL times it out: `RewardUnavailable` (the check failed), or `CheckTooSlow`
  when no answer came at all (a RuntimeError: never a TimeoutError).
- A server too slow for that timeout is refused at the start (`check_pace`: at the first call in
  a process from the server's measured pace, `stepgap_seconds_per_step` in /metrics; in
  `StepGapRLVRWorkflow` by timing a probe rollout), in one line naming
  `AsyncRewardWrapper(..., timeout_seconds=N)` with the N that the measured pace needs.
- A call that waits in AReaL's process pool past the timeout never reaches this function, and
  AReaL gives it 0 all the same: `StepGapRewardWrapper` (AReaL's wrapper, which
  `StepGapRLVRWorkflow` uses) raises `CheckTooSlow` there instead.
- The reward comes back as a `StepGapScore`: a float, as AReaL wants, that carries the
  rollout's logs (label rates, failed checks, EM, repair rate). The function runs in a worker
  process, whose `stats_tracker` AReaL never exports, so `StepGapRLVRWorkflow` logs them in the
  parent, under `stepgap/` in AReaL's rollout stats, beside its own `reward`.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stepgap.reward_arithmetic import RewardResult
from stepgap.serving.framework_inputs import golden_list, question_from_prompt, text_of
from stepgap.serving.reward_function import RewardUnavailable, StepGapReward, available
from stepgap.serving.training_logs import reward_logs

__all__ = [
    "AREAL_TIMEOUT",
    "AReaLReward",
    "CheckTooSlow",
    "ServerTooSlow",
    "RewardUnavailable",
    "StepGapScore",
    "check_pace",
    "reward_fn",
    "wait_budget",
]

AREAL_TIMEOUT = 15.0  # AsyncRewardWrapper's default timeout_seconds, which RLVRWorkflow keeps
TIMEOUT_ENV = "STEPGAP_AREAL_TIMEOUT"  # the timeout_seconds given to AReaL, for `reward_fn`
HEADROOM = 1.5  # the timeout a refusal names fits a rollout's checking time this many times
PREFIX = "stepgap/"
NLI_TRANSFORMERS = "5.4"  # the first transformers 5 whose DeBERTa tokenizer adds [CLS]/[SEP]


class CheckTooSlow(RuntimeError):
    """The check did not come back within the adapter's own wait. Not a TimeoutError, which
    AReaL would turn into a reward of 0."""


class ServerTooSlow(RuntimeError):
    """The checker cannot check a typical rollout within AReaL's reward timeout."""


class StepGapScore(float):
    """A rollout's reward (a float, what AReaL keeps) with its logs (`logs`: `reward_logs`'
    names without prefix), which cross AReaL's process pool with it."""

    logs: dict[str, float]

    def __new__(cls, value: float, logs: dict[str, float] | None = None) -> StepGapScore:
        score = super().__new__(cls, value)
        score.logs = dict(logs or {})
        return score

    def __reduce__(self) -> tuple[Any, ...]:
        return (StepGapScore, (float(self), self.logs))


def wait_budget(areal_timeout: float) -> float:
    """How long the adapter waits for a check when AReaL waits `areal_timeout` seconds: 3 s
    less (a fifth of a short timeout), so its own error reaches AReaL first."""
    if not areal_timeout > 0:
        raise ValueError(f"AReaL's timeout_seconds must be positive, got {areal_timeout}")
    return areal_timeout - min(3.0, 0.2 * areal_timeout)


def _server_usable(budget: float) -> float:
    """What `stepgap serve` spends of a client's `budget` before it answers 503."""
    from stepgap.serving.batching import usable_seconds

    return usable_seconds(budget)


def timeout_needed(rollout_seconds: float, start: float = AREAL_TIMEOUT) -> int:
    """The smallest AReaL timeout (whole seconds, at least `start`) whose budget checks a
    rollout of `rollout_seconds`, with headroom."""
    n = max(1, math.ceil(start))
    while _server_usable(wait_budget(n)) < HEADROOM * rollout_seconds:
        n += 1
    return n


def _refusal(where: str, rollout_seconds: float, how: str, areal_timeout: float) -> str:
    n = timeout_needed(rollout_seconds, areal_timeout)
    return (
        f"stepgap: checking a rollout takes about {rollout_seconds:.1f} s at {where} ({how}), "
        f"too long for AReaL's reward timeout of {areal_timeout:g} s: raise it to {n}: "
        f"AsyncRewardWrapper(reward_fn, timeout_seconds={n}) in your workflow, with "
        f"AReaLReward(areal_timeout={n}) or {TIMEOUT_ENV}={n} (StepGapRLVRWorkflow(..., "
        f"reward_timeout={n}) sets both)"
    )


# ------------------------------------------------------------------ the checker's pace
def metrics_pace(url: str, timeout: float = 5.0) -> float | None:
    """`stepgap_seconds_per_step` from a server's /metrics: seconds a step takes at its
    measured rate; None before its first measure, or when /metrics cannot be read (the check
    that follows then fails on its own, with its own error)."""
    import httpx

    try:
        resp = httpx.get(f"{url.rstrip('/')}/metrics", timeout=timeout)
        resp.raise_for_status()
    except httpx.HTTPError:
        return None
    for line in resp.text.splitlines():
        name, _, value = line.partition(" ")
        if name == "stepgap_seconds_per_step":
            seconds = float(value)
            return seconds if seconds > 0 else None
    return None


def probe_seconds(reward: StepGapReward, wait: float = 60.0) -> tuple[float, int]:
    """(seconds, steps) of checking `stepgap serve`'s probe rollout with this reward's checker
    (behind a URL: one request that may take `wait` seconds). A probe whose check fails is a
    RuntimeError naming why: a checker that is down at the start."""
    from stepgap.serving.remote import RemoteChecker
    from stepgap.serving.server import PROBE

    checker = reward.checker
    if isinstance(checker, RemoteChecker):
        checker = RemoteChecker(checker.urls, timeout=wait, retries=0)
    probe = StepGapReward(checker, reward.variant, reward.lam)
    started = time.monotonic()
    (result,) = probe.score([PROBE.response], [PROBE.question], [PROBE.golden_answers])
    seconds = time.monotonic() - started
    if result.failed_checks:
        raise RuntimeError(
            f"stepgap: the checker failed a probe rollout at the start ({result.unavailable}): "
            "is its judge up?"
        )
    return seconds, len(result.steps)


def check_pace(
    urls: list[str],
    areal_timeout: float,
    reward: StepGapReward | None = None,
    read_within: float = 5.0,
) -> float | None:
    """Seconds that checking a typical rollout takes (None when nothing is measured yet), from
    each server's measured pace (`stepgap_seconds_per_step` times a Search-R1 rollout's steps)
    and, given `reward`, the time of a probe rollout checked with it (/metrics is read within
    `read_within` seconds, else skipped). `ServerTooSlow` when that does not fit in what
    `areal_timeout` leaves the server: one line naming the AReaL timeout to set (`HEADROOM`)."""
    from stepgap.serving.server import ROLLOUT_STEPS

    readings: list[tuple[float, str, str]] = []
    if reward is not None:  # first: the server then has a measured pace to read
        seconds, steps = probe_seconds(reward)
        where = ", ".join(urls) or "the checker in this process"
        readings.append((seconds, where, f"a probe rollout of {steps} steps"))
    for url in urls:
        pace = metrics_pace(url, read_within)
        if pace is not None:
            how = f"{pace:.2f} s a step in its /metrics, {ROLLOUT_STEPS} steps a rollout"
            readings.append((pace * ROLLOUT_STEPS, url, how))
    if not readings:
        return None
    rollout_seconds, where, how = max(readings)
    if rollout_seconds > _server_usable(wait_budget(areal_timeout)):
        raise ServerTooSlow(_refusal(where, rollout_seconds, how, areal_timeout))
    return rollout_seconds


def _nli_can_run_here() -> None:
    """A checker in this process (a reward config) reads its NLI pairs with transformers'
    DeBERTa tokenizer, which transformers 5.3 (AReaL 1.0.4's ceiling) loads without [CLS] and
    [SEP]: every NLI score would be wrong, silently. So the config path wants 5.4 or newer."""
    from importlib.metadata import version

    from packaging.version import Version

    found = version("transformers")
    if Version(found) < Version(NLI_TRANSFORMERS):
        raise RuntimeError(
            f"stepgap: a checker in AReaL's process needs transformers>={NLI_TRANSFORMERS} "
            f"(this venv has {found}, whose DeBERTa tokenizer drops [CLS]/[SEP] from NLI pairs): "
            "run `stepgap serve` in a venv of its own and give its URL (STEPGAP_REWARD_URL)"
        )


_PACED: set[tuple[str, float]] = set()  # (url, timeout) whose pace this process has read


def _size(reward: StepGapReward, budget: float) -> None:
    """A remote checker that gives up within `budget`: the server is sent that deadline (it
    answers 503 before it), and no retry waits past it (AReaL retries on its own)."""
    from stepgap.serving.remote import RemoteChecker

    checker = reward.checker
    if isinstance(checker, RemoteChecker) and (checker.timeout, checker.retries) != (budget, 0):
        checker.close()  # its HTTP client holds the old timeout
        checker.timeout, checker.retries = budget, 0


def _within(seconds: float, run: Callable[[], RewardResult]) -> RewardResult:
    """`run()` in a thread, or `CheckTooSlow` once `seconds` have passed (the thread is left to
    finish; its late answer is dropped)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = run()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="stepgap-areal-check", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise CheckTooSlow(f"stepgap: the step check took over {seconds:.1f} s (no reward)")
    if "error" in box:
        raise box["error"]
    return box["result"]


# ------------------------------------------------------------------ the reward function
def question_of(prompt: Any, data: dict[str, Any]) -> str:
    """The row's `question`, else the prompt's `Question:` line (else its user turn)."""
    if data.get("question"):
        return str(data["question"])
    return question_from_prompt(prompt)


def golden_of(data: dict[str, Any]) -> list[str]:
    """The row's `golden_answers`, else its `answer`."""
    for key in ("golden_answers", "answer"):
        if data.get(key) is not None:
            return golden_list(data[key])
    keys = ", ".join(sorted(data)) or "nothing"
    raise ValueError(
        f"the stepgap reward needs the golden answers in the row's `golden_answers` (or "
        f"`answer`) field; AReaL passed the row's fields {keys}"
    )


@dataclass(frozen=True)
class AReaLReward:
    """AReaL's reward function, its settings held in attributes (picklable, as AReaL's process
    pool needs): `url` (a `stepgap serve`; comma-separated replicas) or `config` (a reward JSON
    or YAML file), else `STEPGAP_REWARD_URL` / `STEPGAP_REWARD_CONFIG`; `areal_timeout`: the
    `timeout_seconds` AReaL's `AsyncRewardWrapper` runs it with (else `STEPGAP_AREAL_TIMEOUT`,
    else 15); the reward options (None: the config's, or the defaults); `refuse_slow`: read a
    server's pace at the first call in a process and refuse one too slow for the timeout."""

    url: str | None = None
    config: str | None = None
    areal_timeout: float | None = None
    variant: str | None = None
    lam: float | None = None
    on_failed_check: str | None = None
    refuse_slow: bool = True

    def timeout(self) -> float:
        if self.areal_timeout is not None:
            return float(self.areal_timeout)
        return float(os.environ.get(TIMEOUT_ENV) or AREAL_TIMEOUT)

    def urls(self) -> list[str]:
        url = self.url if self.url or self.config else os.environ.get("STEPGAP_REWARD_URL")
        return [u.strip().rstrip("/") for u in (url or "").split(",") if u.strip()]

    def reward(self) -> StepGapReward:
        """This process's reward (built once: `process_reward.get_reward`), sized to wait less
        than AReaL does."""
        from stepgap.serving.process_reward import get_reward

        options = {
            "variant": self.variant,
            "lam": self.lam,
            "on_failed_check": self.on_failed_check,
        }
        settings: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
        config = self.config or (None if self.url else os.environ.get("STEPGAP_REWARD_CONFIG"))
        if self.urls():
            settings["urls"] = self.urls()
        elif config:
            _nli_can_run_here()
            settings["config"] = config
        else:
            raise RuntimeError(
                "the stepgap reward for AReaL is not configured: give AReaLReward(url=...) (a "
                "`stepgap serve`) or config=..., or set STEPGAP_REWARD_URL or STEPGAP_REWARD_CONFIG"
            )
        reward = get_reward(settings)
        _size(reward, wait_budget(self.timeout()))
        return reward

    def check_pace(self, probe: bool = True) -> float | None:
        """`check_pace` for this reward: the servers' measured pace and (`probe`) a probe
        rollout checked the way training checks them. Call it where the workflow is built."""
        return check_pace(self.urls(), self.timeout(), self.reward() if probe else None)

    def score(self, prompt: Any, completions: Any, data: dict[str, Any]) -> RewardResult:
        """The rollout's `RewardResult`, or `CheckTooSlow` once half-way from the adapter's
        budget to AReaL's timeout (the first call in a process reads the servers' pace first,
        within that same time)."""
        timeout = self.timeout()
        budget = wait_budget(timeout)
        deadline = time.monotonic() + (budget + timeout) / 2
        if self.refuse_slow:
            for url in self.urls():
                if (url, timeout) not in _PACED:
                    check_pace([url], timeout, read_within=0.2 * budget)
                    _PACED.add((url, timeout))
        reward = self.reward()
        response, question, golden = (
            text_of(completions),
            question_of(prompt, data),
            golden_of(data),
        )
        return _within(
            deadline - time.monotonic(), lambda: reward.score([response], [question], [golden])[0]
        )

    def __call__(
        self,
        prompt: Any,
        completions: Any,
        prompt_ids: Any = None,
        completion_ids: Any = None,
        **data: Any,
    ) -> StepGapScore:
        """AReaL's `reward_fn(prompt, completions, prompt_ids, completion_ids, **data)`: the
        typed reward, or `RewardUnavailable` / `CheckTooSlow` (never a made-up number)."""
        try:
            result = self.score(prompt, completions, data)
        except TimeoutError as exc:  # AReaL would read it as its own timeout: a reward of 0
            raise CheckTooSlow(f"stepgap: the step check timed out ({exc}): no reward") from None
        return StepGapScore(available(result), reward_logs([result], prefix=""))


def reward_fn(
    prompt: Any, completions: Any, prompt_ids: Any = None, completion_ids: Any = None, **data: Any
) -> StepGapScore:
    """AReaL's reward function by name (`"stepgap.serving.areal.reward_fn"`): `AReaLReward()`,
    its settings from the environment."""
    return AReaLReward()(prompt, completions, prompt_ids, completion_ids, **data)


# ------------------------------------------------------------------ AReaL's classes
def _wrapper_class() -> type:
    from areal.api.reward_api import AsyncRewardWrapper

    class StepGapRewardWrapper(AsyncRewardWrapper):
        """AReaL's `AsyncRewardWrapper` that raises where AReaL's would return its 0: a call
        still waiting in AReaL's process pool when `timeout_seconds` runs out (the reward
        function never started, so it could not answer in time). With the stepgap reward
        function, whose every answer is a `StepGapScore`, any other result is that 0."""

        async def __call__(self, *args: Any, **kwargs: Any) -> float:
            reward = await super().__call__(*args, **kwargs)
            if isinstance(self.reward_fn, AReaLReward) and not isinstance(reward, StepGapScore):
                raise CheckTooSlow(
                    f"stepgap: AReaL's reward wrapper ran out of its {self.timeout_seconds:g} s "
                    f"(the call waited in its pool of {self.max_workers} reward process(es)) and "
                    "would have given 0: raise its max_workers or timeout_seconds"
                )
            return reward

    return StepGapRewardWrapper


def _workflow_class() -> type:
    from areal import workflow_context
    from areal.utils import stats_tracker
    from areal.utils.dynamic_import import import_from_string
    from areal.workflow.rlvr import RLVRWorkflow

    class StepGapRLVRWorkflow(RLVRWorkflow):
        """AReaL's `RLVRWorkflow` with the stepgap reward: its reward wrapper a
        `StepGapRewardWrapper` with `reward_timeout` (RLVRWorkflow keeps 15 s), the
        server's pace checked here, at the
        start (`check_pace_at_start`), and each rollout's stepgap logs added to AReaL's
        rollout stats (`stepgap/...`, averaged over rollouts; `stepgap/no_reward` 1 for a
        rollout whose check failed, which AReaL then drops)."""

        def __init__(
            self,
            reward_fn: Any = None,
            *args: Any,
            reward_timeout: float = AREAL_TIMEOUT,
            check_pace_at_start: bool = True,
            **kwargs: Any,
        ) -> None:
            if isinstance(reward_fn, str):
                reward_fn = import_from_string(reward_fn)
            if reward_fn is None or reward_fn is globals()["reward_fn"]:
                reward_fn = AReaLReward()
            if isinstance(reward_fn, AReaLReward):
                reward_fn = _replace(reward_fn, areal_timeout=reward_timeout)
                if check_pace_at_start:
                    reward_fn.check_pace(probe=True)
            super().__init__(reward_fn, *args, **kwargs)
            wrapper = __getattr__("StepGapRewardWrapper")
            self.async_reward_fn = wrapper(reward_fn, timeout_seconds=reward_timeout)

        async def _compute_rewards(self, resp: Any, prompt_str: str, task_data: Any) -> float:
            stats = stats_tracker.get(workflow_context.stat_scope())
            try:
                reward = await super()._compute_rewards(resp, prompt_str, task_data)
            except Exception:
                stats.scalar(**{f"{PREFIX}no_reward": 1.0})
                raise
            logs = getattr(reward, "logs", None) or {}
            stats.scalar(**{f"{PREFIX}{k}": v for k, v in logs.items()})
            return reward

    return StepGapRLVRWorkflow


def _replace(reward: AReaLReward, **changes: Any) -> AReaLReward:
    from dataclasses import replace

    return replace(reward, **changes)


_MADE_ON_USE = {"StepGapRLVRWorkflow": _workflow_class, "StepGapRewardWrapper": _wrapper_class}


def __getattr__(name: str) -> Any:
    """`StepGapRLVRWorkflow` and `StepGapRewardWrapper`, made on first use: they import
    AReaL's classes (its workflow imports torch and transformers), which the reward function's
    worker processes never need."""
    if name in _MADE_ON_USE:
        cls = globals().get(name) or _MADE_ON_USE[name]()
        cls.__module__, cls.__qualname__ = __name__, name
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
