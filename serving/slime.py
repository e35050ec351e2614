"""The reward for slime: its `remote_rm` protocol, served, and its custom reward function.

slime (THUDM) asks for a reward in one of two ways, and stepgap answers both:

- `--rm-type remote_rm --rm-url http://HOST:PORT/remote_rm`: slime POSTs each sample as
  `{"prompt", "response", "label"}` and takes the JSON answer as its reward. `stepgap serve`
  answers `POST /remote_rm` with the typed reward, a number; the label rates, failed checks and
  rejections are in the server's `/metrics`.
  slime's client waits 120 s a request (`aiohttp.ClientTimeout(total=120)`), raises on any
  non-2xx answer and tries 10 times with backoff (1, 2, 4, ... 30 s), then fails the rollout. So
  a sample that cannot be checked within that time is answered 503 before it (the server's
  `--client-timeout`, at most `SLIME_SECONDS`, when slime sends no `X-Stepgap-Timeout`), and a
  sample whose check failed is answered 503 naming why: slime retries both, and never reads a
  number that is not the typed reward.
- `--custom-rm-path stepgap.serving.slime.rm`: slime imports this module in its rollout process
  and awaits `rm(args, sample)` (or `rm(args, samples)` with `--group-rm`). The checker is
  built from the environment: `STEPGAP_REWARD_URL` (`stepgap serve` replicas) or
  `STEPGAP_REWARD_CONFIG` (a reward configuration file), as for veRL and OpenRLHF. A sample
  whose check failed raises `RewardUnavailable`: slime's own error for a reward it cannot have.

The label is the golden answers: a string, a list, or Search-R1's `reward_model` column
(`{"ground_truth": {"target": [...]}}`, slime's `--label-key reward_model`). The question is
`sample.metadata["question"]` where the sample has it, else the prompt's `Question:` line
(Search-R1's template), else its user turn.

slime itself is not on the package index; these are tested against its payload and its client's
rules (tests/serving/test_slime.py), not against its own code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from stepgap.reward_arithmetic import RewardResult
from stepgap.serving.framework_inputs import golden_list, question_from_prompt
from stepgap.serving.reward_function import available

# What slime's `remote_rm` client waits for one answer, in seconds (its aiohttp total timeout).
SLIME_SECONDS = 120.0


def slime_inputs(
    prompt: Any, response: str, label: Any, metadata: Any = None
) -> tuple[str, str, list[str]]:
    """One slime sample -> (response, question, golden answers). `prompt` is the text slime
    generated from, or its chat messages; `label` the golden answers in any of the forms above."""
    if not isinstance(response, str):
        raise ValueError(f"the response must be a string, got {type(response).__name__}")
    if label is None:
        raise ValueError(
            "no label (the golden answers): slime sends the column --label-key names, e.g. "
            "--label-key reward_model for Search-R1's data"
        )
    question = metadata.get("question") if isinstance(metadata, dict) else None
    if not isinstance(question, str) or not question.strip():
        question = question_from_prompt(prompt)
    return response, question, golden_list(label)


def slime_answer(result: RewardResult) -> float:
    """What slime reads back: the reward, a number. A sample without one raises
    `RewardUnavailable` (the server answers 503, which slime retries), never a number."""
    return available(result)


def _sample_inputs(sample: Any) -> tuple[str, str, list[str]]:
    return slime_inputs(
        sample.prompt, sample.response, sample.label, getattr(sample, "metadata", None)
    )


def _score(samples: Sequence[Any], kwargs: dict[str, Any]) -> list[float]:
    from stepgap.serving.process_reward import get_reward

    inputs = [_sample_inputs(s) for s in samples]
    responses, questions, golden = (list(x) for x in zip(*inputs, strict=True))
    results = get_reward(kwargs).score(responses, questions, golden)
    return [available(r) for r in results]  # RewardUnavailable: never a number for a failed check


async def rm(args: Any, sample: Any, **kwargs: Any) -> float | list[float]:
    """slime's custom reward function (`--custom-rm-path stepgap.serving.slime.rm`): the typed
    reward of one sample, or of each sample of a group (`--group-rm`), in input order. The check
    runs in a thread, so slime's event loop goes on meanwhile."""
    if isinstance(sample, list):
        return await asyncio.to_thread(_score, sample, kwargs)
    (reward,) = await asyncio.to_thread(_score, [sample], kwargs)
    return reward
