"""The reward built from a JSON file (`STEPGAP_REWARD_CONFIG`, veRL's `reward_kwargs.config`):
every judge option of `stepgap check` reaches the judge, and a key the file cannot mean is an
error naming the file and the key, never a default quietly used instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepgap.serving import process_reward, verl


@pytest.fixture(autouse=True)
def fresh_reward(monkeypatch):
    """No reward left from another test, and none from the environment but the file's."""
    for name in ("STEPGAP_REWARD_URL", "STEPGAP_REWARD_CONFIG", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    process_reward.reset()
    yield
    process_reward.reset()


def _write(path: Path, data: dict | str) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data, indent=2), "utf-8")
    return path


@pytest.fixture
def replay(examples_dir) -> dict[str, str]:
    return {
        "judge": f"replay:{examples_dir / 'judge_replay.jsonl'}",
        "nli": f"replay:{examples_dir / 'nli_replay.jsonl'}",
    }


def test_base_url_and_the_judge_options_of_the_file_reach_the_judge(
    fake_openai, replay, example_traces, expected_rewards, tmp_path, monkeypatch
):
    """The file's `base_url` is the server the judge asks (the fake one, which knows the
    examples' answers), with the key from the variable `api_key_env` names; the rewards are
    those of the stored verdicts."""
    monkeypatch.setenv("STEPGAP_TEST_JUDGE_KEY", "sk-from-the-environment")
    config = {
        "judge": "openai:gpt-4.1-mini",
        "nli": replay["nli"],
        "base_url": fake_openai.base_url,
        "api_key_env": "STEPGAP_TEST_JUDGE_KEY",
        "max_retries": 0,
        "concurrency": 3,
        "response_format": "json_object",
        "cache": str(tmp_path / "judge-cache.sqlite"),
        "entail_threshold": 0.5,
    }
    monkeypatch.setenv("STEPGAP_REWARD_CONFIG", str(_write(tmp_path / "reward.json", config)))
    out = verl.compute_score_batch(
        data_sources=["nq"] * len(example_traces),
        solution_strs=[t.response for t in example_traces],
        ground_truths=[{"target": t.golden_answers} for t in example_traces],
        extra_infos=[{"question": t.question} for t in example_traces],
    )
    assert [o["score"] for o in out] == pytest.approx(
        [expected_rewards[t.id] for t in example_traces]
    )
    reward = process_reward.get_reward()
    assert sum(reward.failures.values()) == 0
    assert fake_openai.answered() and set(fake_openai.formats_seen) == {"json_object"}
    assert set(fake_openai.auth_headers) == {"Bearer sk-from-the-environment"}
    judge = reward.checker.judge
    assert (judge.base_url, judge.concurrency, judge.max_retries) == (fake_openai.base_url, 3, 0)
    assert (tmp_path / "judge-cache.sqlite").is_file()


def test_the_tree_and_reward_keys_of_the_file_are_used_and_reward_kwargs_win(replay, tmp_path):
    config = _write(
        tmp_path / "reward.json",
        {
            **replay,
            "entail-threshold": 0.7,
            "hypothesis": "claim",
            "variant": "binary_gap",
            "lam": 0.5,
        },
    )
    reward = process_reward.get_reward({"config": str(config)})
    tree = reward.checker.config
    assert (tree.entail_threshold, tree.hypothesis) == (0.7, "claim")
    assert (reward.variant, reward.lam) == ("binary_gap", 0.5)
    again = process_reward.get_reward({"config": str(config), "variant": "search_only", "lam": 2.0})
    assert (again.variant, again.lam) == ("search_only", 2.0)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"base_urll": "http://h/v1"},
            r"reward\.json:4: base_urll: not a key of a reward configuration; did you mean "
            r"base_url\?",
        ),
        ({"api_key": "sk-x"}, r"reward\.json:4: api_key: an API key is never read from a file"),
        (
            {"concurrency": 2.5},
            r"reward\.json:4: concurrency: 2\.5 is not a valid value \(invalid literal for int",
        ),
        (
            {"response_format": "xml"},
            r"reward\.json:4: response_format: 'xml' is not one of auto, json_schema",
        ),
        ({"cache": False}, r"reward\.json:4: cache: expected text, got false"),
        ({"no_cache": "yes"}, r"reward\.json:4: no_cache: expected true or false, got 'yes'"),
        (
            {"entail_threshold": "high"},
            r"reward\.json:4: entail_threshold: 'high' is not a valid value",
        ),
        ({"entail_threshold": 1.5}, r"reward\.json:4: entail_threshold must be in \(0, 1\]"),
        ({"variant": "typed"}, r"reward\.json:4: variant: 'typed' is not one of search_only"),
        ({"lam": True}, r"reward\.json:4: lam: expected a number, got true"),
    ],
)
def test_a_key_or_value_the_file_cannot_mean_names_the_file_line_and_key(
    replay, tmp_path, monkeypatch, extra, message
):
    config = _write(tmp_path / "reward.json", {**replay, **extra})
    monkeypatch.setenv("STEPGAP_REWARD_CONFIG", str(config))
    with pytest.raises(ValueError, match=message) as err:
        verl.compute_score("nq", "<answer>x</answer>", "x", {"question": "q"})
    assert str(config) in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{\n  "judge": "replay:x",\n  "nli": "replay:y",,\n}', r"reward\.json:3: not JSON"),
        ('["judge", "nli"]', r"reward\.json: expected a mapping of option names to values"),
        ('{"judge": "openai:m"}', r"reward\.json: give --judge and --nli, or --bundle"),
    ],
)
def test_a_file_that_is_no_configuration_names_the_file(tmp_path, text, message):
    config = _write(tmp_path / "reward.json", text)
    with pytest.raises(ValueError, match=message) as err:
        process_reward.get_reward({"config": str(config)})
    assert str(config) in str(err.value)


def test_the_reward_router_serves_a_bundles_student_only():
    from stepgap.serving.process_reward import served_by_router
    from stepgap.teacher import CheckerConfig

    served = served_by_router(CheckerConfig(bundle="/b"), "10.0.0.2:30000", "/b/student")
    assert (served.judge, served.base_url) == ("openai:/b/student", "http://10.0.0.2:30000/v1")
    with pytest.raises(ValueError, match="serves a bundle's student: give the bundle"):
        served_by_router(CheckerConfig(judge="openai:m", nli="replay:x"), "h:1", "m")
    with pytest.raises(ValueError, match="set reward_kwargs.served_model"):
        served_by_router(CheckerConfig(bundle="/b"), "h:1", None)
