"""The reward of this process, for framework hooks that are plain functions (veRL's
`compute_score`, OpenRLHF's `reward_func`): built once, from the hook's keyword arguments, from
`configure(reward)`, or from the environment.

- keyword arguments (veRL's `custom_reward_function.reward_kwargs`): `url` or `urls` (one or
  more `stepgap serve` replicas), or `config` (a JSON file, below); with the reward options
  (`variant`, `lam`, `on_failed_check`: `RewardOptions`), which win over the file's;
- `configure(reward)`: any `StepGapReward`, e.g. over an in-process checker;
- `STEPGAP_REWARD_URL` (comma-separated replicas) or `STEPGAP_REWARD_CONFIG` (the JSON file).

The JSON file holds `stepgap serve`'s checker and reward options by name, with their defaults:
the fields of `CheckerConfig` (`{"judge", "nli"}` or `{"bundle"}`, with `base_url`,
`api_key_env`, `concurrency`, `no_cache`, `entail_threshold`, ...) and those of `RewardOptions`
(`variant`, `lam`, `on_failed_check`), the same names as in Python. A key it does not know is an
error, never ignored: a misspelt `base_url` would send every judge request to the default host.
The API key is read from the variable `api_key_env` names, never from the file.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from stepgap.serving.reward_function import RewardOptions, StepGapReward
from stepgap.teacher.build import REFUSED_KEYS, CheckerConfig

_REWARD: StepGapReward | None = None
_FROM: object = None  # what the reward was built from, to rebuild when veRL passes other kwargs
_SETTINGS = ("url", "urls", "config", *RewardOptions.names(), "served_model",
             "reward_router_address")  # fmt: skip


def reset() -> None:
    """Forget the reward of this process (tests, or to rebuild after the environment changed)."""
    global _REWARD, _FROM
    _REWARD, _FROM = None, None


def configure(reward: StepGapReward) -> None:
    """Use this reward in this process (instead of `reward_kwargs` or the environment)."""
    global _REWARD, _FROM
    _REWARD, _FROM = reward, "configure"


def _options(settings: dict[str, Any], options: RewardOptions) -> RewardOptions:
    """`options` with the reward keys that `settings` (veRL's reward_kwargs) give."""
    given = {k: settings[k] for k in RewardOptions.names() if k in settings}
    try:
        return replace(options, **given)
    except ValueError as exc:
        raise ValueError(f"reward_kwargs: {exc}") from None


def _from_settings(settings: dict[str, Any]) -> StepGapReward:
    urls = settings.get("urls") or settings.get("url")
    if urls:
        from stepgap.serving.remote import RemoteChecker

        return _options(settings, RewardOptions()).reward(RemoteChecker(urls))
    path = settings["config"]
    config, options = reward_config(path)
    if settings.get("reward_router_address"):
        config = served_by_router(
            config, settings["reward_router_address"], settings.get("served_model"), path
        )
    from stepgap.export.offline import load_checker

    try:
        built = load_checker(config)
    except ValueError as exc:  # what the file asks for cannot be built
        raise ValueError(f"{path}: {exc}") from exc
    return _options(settings, options).reward(built)


def served_by_router(
    config: CheckerConfig, address: str, model: str | None, path: str | Path = "reward config"
) -> CheckerConfig:
    """The bundle's checker with stages A-C asked of the student that veRL serves as its reward
    model (`reward.reward_model.enable`, the bundle's student as `model_path`, rollout vllm or
    sglang) behind the router at `address`: the student's schema as guided JSON, the served
    model's name; the bundle's ONNX NLI, thresholds and prompt decide here, in the worker."""
    if not config.bundle:
        raise ValueError(
            f"{path}: veRL passed a reward_router_address (its reward model is enabled), which "
            "serves a bundle's student: give the bundle (`bundle`) in the configuration"
        )
    if not model:
        raise ValueError(
            f"{path}: the reward model's served name is unknown: set reward_kwargs.served_model "
            "(veRL serves reward.reward_model.model_path under that name)"
        )
    base = address if "://" in address else f"http://{address}"
    return replace(config, judge=f"openai:{model}", base_url=base.rstrip("/") + "/v1")


def reward_config(path: str | Path) -> tuple[CheckerConfig, RewardOptions]:
    """The checker configuration and reward options of a JSON file (YAML for a `.yaml` or
    `.yml` file) whose keys are `stepgap serve`'s options (`base_url` or `base-url`). An unknown
    key, a value the flag would refuse or a file that is not a mapping is a ValueError naming
    the file, the line and the key."""
    from stepgap.arguments import ArgumentParser

    parser = ArgumentParser(
        (CheckerConfig, RewardOptions),
        what="a reward configuration",
        refused_keys=REFUSED_KEYS,
    )
    kind = "yaml" if Path(path).suffix in (".yaml", ".yml") else "json"
    config, options = parser.parse_file(path, kind=kind)
    return config, options


def get_reward(kwargs: dict[str, Any] | None = None) -> StepGapReward:
    """The reward of this process: built once, from `reward_kwargs`, `configure` or the
    environment (see the module docstring)."""
    global _REWARD, _FROM
    kwargs = kwargs or {}
    settings = {k: v for k, v in kwargs.items() if k in _SETTINGS and v is not None}
    if settings.get("reward_router_address"):  # veRL's reward loop with its reward model on
        if not (settings.keys() & {"url", "urls", "config"}):
            if os.environ.get("STEPGAP_REWARD_CONFIG"):
                settings["config"] = os.environ["STEPGAP_REWARD_CONFIG"]
        tokenizer = kwargs.get("reward_model_tokenizer")
        if "served_model" not in settings and getattr(tokenizer, "name_or_path", None):
            settings["served_model"] = tokenizer.name_or_path  # veRL's model_path
    if not (settings.keys() & {"url", "urls", "config"}):  # no bundle to serve: the router
        for key in ("reward_router_address", "served_model"):  # is not ours to use
            settings.pop(key, None)
    if settings and _FROM != settings:
        _REWARD, _FROM = _from_settings(settings), settings
    if _REWARD is None:
        url, config = os.environ.get("STEPGAP_REWARD_URL"), os.environ.get("STEPGAP_REWARD_CONFIG")
        if url:
            _REWARD = _from_settings({"urls": [u for u in url.split(",") if u.strip()]})
        elif config:
            _REWARD = _from_settings({"config": config})
        else:
            raise RuntimeError(
                "the stepgap reward is not configured: set custom_reward_function."
                "reward_kwargs.url (a `stepgap serve` endpoint), call "
                "stepgap.serving.verl.configure(reward), or set STEPGAP_REWARD_URL or "
                "STEPGAP_REWARD_CONFIG"
            )
        _FROM = "environment"
    return _REWARD
