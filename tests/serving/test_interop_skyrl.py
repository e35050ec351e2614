"""Episodes of `stepgap.serving.skyrl`'s environment through skyrl-gym 0.4's own code: made by
`skyrl_gym.make` from its registry, driven as SkyRL's `SkyRLGymGenerator.agent_loop` drives
an env (`init(prompt)`, `step(output)` from its env thread pool until `done`, `get_metrics()`,
`close()`), its metrics aggregated by skyrl-gym's `aggregate_for_environment`.

The policy is scripted (each example trace's Search-R1 turns); the search asks a local BM25
index behind the retrieval server; the judge is an OpenAI-compatible server on 127.0.0.1 and
the NLI the tiny DeBERTa. The oracle: the sum of an episode's step rewards (what SkyRL adds up
over the trajectory's tokens) is `StepGapReward.score`'s reward on the episode's text, the
contents of its chat history after the prompt joined, as skyrl-gym's own search env joins them.
"""

from __future__ import annotations

import asyncio
import copy
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stepgap.data_builders.rollout_formats import SEARCH_R1_TEMPLATE
from tests.fixtures.peers import import_peer

skyrl_gym = import_peer("skyrl_gym")

from tests.fixtures.live_server import LiveServer  # noqa: E402

pytestmark = pytest.mark.timeout(600)
REPO = Path(__file__).resolve().parents[2]
TURN_SECONDS = 0.2
SYSTEM = "You are a helpful and harmless assistant."  # SkyRL's searchr1_dataset.py


@dataclass
class Episode:
    question: str
    golden: list[str]
    chat: list[dict] = field(default_factory=list)  # after the prompt
    rewards: list[float] = field(default_factory=list)  # each step()'s, in order
    outputs: list[dict] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "".join(m["content"] for m in self.chat)


def row_of(trace, settings: dict | None = None, with_question: bool = True) -> dict:
    """A row of SkyRL's Search-R1 data (examples/train/search/searchr1_dataset.py): its prompt,
    and the columns SkyRL hands the env as `extras`."""
    prompt = [{"role": "system", "content": SYSTEM},
              {"role": "user", "content": SEARCH_R1_TEMPLATE.format(question=trace.question)}]  # fmt: skip
    extras = {"reward_spec": {"ground_truth": {"target": list(trace.golden_answers)},
                              "style": "rule"},
              "data_source": "searchR1_nq"}  # fmt: skip
    if with_question:
        extras["extra_info"] = {"question": trace.question, "split": "train"}
    if settings is not None:
        extras["stepgap"] = settings
    return {"prompt": prompt, "env_extras": extras}


async def agent_loop(env_class, row, env_config, policy, pool, max_turns=6) -> Episode:
    """SkyRL's `agent_loop` without its tokens: the env made from the registry with the
    generator's `max_turns` in its extras, `init`, then `step` on each output in the env pool
    until done; `get_metrics`, `close`."""
    loop = asyncio.get_running_loop()
    extras = copy.deepcopy(row["env_extras"])
    extras["max_turns"] = max_turns
    env = skyrl_gym.make(env_class, env_config=env_config, extras=extras)
    chat, _ = await loop.run_in_executor(pool, env.init, copy.deepcopy(row["prompt"]))
    episode = Episode(question="", golden=[])
    done = False
    while not done:
        output = await policy(chat + episode.chat)
        step = await loop.run_in_executor(pool, env.step, output)
        episode.chat += [{"role": "assistant", "content": output}, *step["observations"]]
        episode.rewards.append(step["reward"])
        episode.outputs.append(step)
        done = step["done"]
    episode.metrics = env.get_metrics()
    await loop.run_in_executor(pool, env.close)
    return episode


def scripted_policy(scripts):
    """The next turn of the trace whose question the prompt holds (by the turns it has had)."""
    turns = {s["trace"].question: s["turns"] for s in scripts}

    async def policy(chat):
        await asyncio.sleep(TURN_SECONDS)
        question = next(q for q in turns if q in chat[1]["content"])
        return turns[question][sum(m["role"] == "assistant" for m in chat)]

    return policy


def run_episodes(
    scripts, env_config=None, settings=None, with_question=True, max_turns=6
) -> list[Episode]:
    """The scripts' episodes at once, as SkyRL's `generate` gathers its trajectories."""
    from stepgap.serving.skyrl import ENV_ID

    async def all_of_them():
        with ThreadPoolExecutor(16, thread_name_prefix="skyrl-gym-env-") as pool:
            return await asyncio.gather(*(
                agent_loop(ENV_ID, row_of(s["trace"], settings, with_question),
                           env_config if env_config is not None else {},
                           scripted_policy(scripts), pool, max_turns)
                for s in scripts
            ))  # fmt: skip

    episodes = asyncio.run(all_of_them())
    for e, s in zip(episodes, scripts, strict=True):
        e.question, e.golden = s["trace"].question, list(s["trace"].golden_answers)
    return episodes


def post_hoc(reward, episodes):
    return reward.score([e.text for e in episodes], [e.question for e in episodes],
                        [e.golden for e in episodes])  # fmt: skip


def test_skyrl_episodes_check_each_step_as_its_search_returns_and_add_up_to_the_reward(
    inline_reward, scripts, retriever_url, monkeypatch
):
    from skyrl_gym.metrics import aggregate_for_environment

    from stepgap.serving import inline, process_reward
    from stepgap.serving.skyrl import ENV_ID
    from stepgap.serving.training_logs import reward_logs

    process_reward.configure(inline_reward)
    monkeypatch.setenv("STEPGAP_RETRIEVER_URL", retriever_url)
    episodes = run_episodes(scripts)
    (checker,) = inline._CHECKERS.values()
    stats = dict(checker.streaming.stats)
    searches = sum(len(s["turns"]) - 1 for s in scripts)
    assert stats["submitted"] == searches and stats["reused"] == searches
    assert stats["asked_at_end"] == len(scripts)
    assert len(inline_reward.checker.judge.asked) == searches + len(scripts)
    for e, s in zip(episodes, scripts, strict=True):
        assert len(e.rewards) == len(s["turns"]) and e.rewards[:-1] == [0.0] * (len(s["turns"]) - 1)
        assert e.text.count("<information>Doc 1(Title: ") == len(s["turns"]) - 1
        assert [o["done"] for o in e.outputs] == [False] * (len(s["turns"]) - 1) + [True]

    inline_reward.checker.judge.asked.clear()
    results = post_hoc(inline_reward, episodes)
    assert [sum(e.rewards) for e in episodes] == pytest.approx(
        [r.reward for r in results], abs=1e-9
    )
    for e, r in zip(episodes, results, strict=True):
        last = e.outputs[-1]["metadata"]["stepgap"]
        assert len(last["turn_rewards"]) == len(e.rewards)
        assert sum(last["turn_rewards"]) == pytest.approx(r.reward, abs=1e-9)
        assert last["em"] == r.em
    aggregated = aggregate_for_environment(ENV_ID, [e.metrics for e in episodes])
    assert aggregated == pytest.approx(reward_logs(results, prefix="stepgap/"), abs=1e-12)


def test_through_stepgap_serve_from_skyrls_env_config_the_rewards_are_the_same(
    inline_reward, scripts, retriever_url
):
    """The checker is `stepgap serve` and the retriever as SkyRL's env config names them
    (`environment.skyrl_gym.stepgap_search`); the question comes from the prompt."""
    import httpx

    from stepgap.serving.server import create_app

    with LiveServer(create_app(inline_reward)) as url:
        config = {"url": url, "search_url": retriever_url, "topk": 3}
        episodes = run_episodes(scripts, env_config=config, with_question=False)
        metrics = httpx.get(f"{url}/metrics").text
    searches = sum(len(s["turns"]) - 1 for s in scripts)
    assert f'stepgap_requests_total{{route="steps"}} {float(searches)}' in metrics
    assert len(inline_reward.checker.judge.asked) == searches + len(scripts)
    inline_reward.checker.judge.asked.clear()
    expected = [r.reward for r in post_hoc(inline_reward, episodes)]
    assert [sum(e.rewards) for e in episodes] == pytest.approx(expected, abs=1e-9)


def test_with_typed_feedback_each_gaps_note_follows_its_information_and_the_rewards_hold(
    inline_reward, scripts, retriever_url
):
    """`feedback: typed` in the row's `extras["stepgap"]`, with a wait long enough for every
    verdict: each search's observation carries the note of its step's post-hoc label (none for
    no_gap), the metrics count them, and the rewards are those of the texts, notes and all."""
    from stepgap.feedback import note_for
    from stepgap.serving import process_reward

    process_reward.configure(inline_reward)
    settings = {"search_url": retriever_url, "feedback": "typed", "feedback_wait": 120}
    episodes = run_episodes(scripts, settings=settings)
    sent = []
    for e, result in zip(episodes, post_hoc(inline_reward, episodes), strict=True):
        expected = [note_for(s.label) for s in result.steps[:-1]]  # the searches' steps
        observations = [m["content"] for m in e.chat if m["role"] == "user"]
        notes = [n for o in observations
                 for n in re.findall(r"</information>\n\n(<feedback>.*?</feedback>)\n\n", o)]  # fmt: skip
        assert notes == [n for n in expected if n] and e.text.count("<feedback>") == len(notes)
        assert e.metrics["stepgap/feedback/notes"] == len(notes)
        assert e.metrics["stepgap/feedback/too_late"] == 0
        assert sum(e.rewards) == pytest.approx(result.reward, abs=1e-9)
        sent += notes
    assert sent  # some step is a gap


def test_at_skyrls_turn_limit_the_episode_ends_with_the_reward_of_its_text(
    inline_reward, scripts, retriever_url, monkeypatch
):
    """`generator.max_turns` = 1: the first turn, a search, is the last; it is not searched and
    the episode's one reward is the reward of its text as it stands."""
    from stepgap.serving import process_reward

    process_reward.configure(inline_reward)
    monkeypatch.setenv("STEPGAP_RETRIEVER_URL", retriever_url)
    episodes = run_episodes(scripts[:2], max_turns=1)
    for e, s in zip(episodes, scripts[:2], strict=True):
        assert [m["content"] for m in e.chat] == [s["turns"][0]] and len(e.rewards) == 1
    expected = [r.reward for r in post_hoc(inline_reward, episodes)]
    assert [e.rewards[0] for e in episodes] == pytest.approx(expected, abs=1e-9)


def test_a_failed_check_raises_skyrls_error_never_a_reward(
    examples_dir, tiny_nli, scripts, retriever_url, monkeypatch
):
    """A judge that fails: the episode's searches still come back, and its last step raises
    `CheckFailed`, a skyrl-gym `Error`, out of SkyRL's gather: no reward of 0 or EM."""
    from stepgap.serving import StepGapReward, inline, process_reward
    from stepgap.serving.skyrl import CheckFailed
    from stepgap.teacher import Checker, load_nli
    from stepgap.teacher.judges.base import JudgeBackend

    class Broken(JudgeBackend):
        name = "broken"

        def judge(self, requests, *, stop=None):
            raise RuntimeError("judge is down")

    inline.reset()
    process_reward.reset()
    process_reward.configure(StepGapReward(Checker(Broken(), load_nli(str(tiny_nli)))))
    monkeypatch.setenv("STEPGAP_RETRIEVER_URL", retriever_url)
    try:
        with pytest.raises(CheckFailed, match="has no reward .*judge is down") as raised:
            run_episodes(scripts[:1])
    finally:
        inline.reset()
        process_reward.reset()
    assert isinstance(raised.value, skyrl_gym.error.Error)


def test_the_env_is_in_skyrl_gyms_registry_and_refuses_a_row_without_golden_answers(monkeypatch):
    from stepgap.serving.skyrl import ENV_ID, StepGapSearchEnv, _settings

    assert skyrl_gym.spec(ENV_ID).entry_point == "stepgap.serving.skyrl:StepGapSearchEnv"
    with pytest.raises(ValueError, match="reward_spec.ground_truth"):
        skyrl_gym.make(ENV_ID, env_config={}, extras={"max_turns": 2})
    with pytest.raises(ValueError, match="unknown keys \\['urll'\\]"):
        StepGapSearchEnv({}, {"reward_spec": {"ground_truth": "x"}, "stepgap": {"urll": "x"}})
    monkeypatch.setenv("STEPGAP_REWARD_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("STEPGAP_RETRIEVER_TOPK", "5")
    settings = _settings({"config": "reward.json"}, {"stepgap": {"topk": 2}})
    assert (settings["url"], settings["config"], settings["topk"]) == (None, "reward.json", 2)
    assert _settings(None, {})["url"] == "http://127.0.0.1:9"


def test_the_example_says_what_to_start_first():
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "skyrl_search.py"), "--help"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    for first in ("stepgap serve --judge", "stepgap serve-index", "vllm serve", "--policy-url"):
        assert first in out.stdout
