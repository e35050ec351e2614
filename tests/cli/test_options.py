"""The checker's flags are made from `CheckerConfig` and `TreeConfig`: one list of options, the
same defaults on the command line and in a reward worker's JSON file."""

from __future__ import annotations

import json

from stepgap.cli import build_parser
from stepgap.cli.options import checker_config, reward_options
from stepgap.serving.process_reward import reward_config
from stepgap.serving.reward_function import RewardOptions
from stepgap.teacher import CheckerConfig
from stepgap.tree import TreeConfig


def _serve(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def test_every_field_has_its_flag_with_the_fields_default():
    args = _serve()
    assert checker_config(args) == CheckerConfig()
    for name in CheckerConfig.model_fields.keys() - {"tree"}:
        assert hasattr(args, name), name


def test_flags_and_the_reward_file_give_the_same_configuration(tmp_path):
    flags = checker_config(
        _serve("--judge", "openai:m", "--nli", "replay:n", "--base-url", "http://h/v1",
               "--concurrency", "3", "--no-cache", "--timeout", "7", "--nli-provider", "CPU",
               "--hypothesis", "answer", "--entail-threshold", "0.7", "--variant", "binary_gap",
               "--on-failed-check", "zero", "--engine-slots", "4")
    )  # fmt: skip
    path = tmp_path / "reward.json"
    path.write_text(json.dumps({
        "judge": "openai:m", "nli": "replay:n", "base-url": "http://h/v1", "concurrency": 3,
        "no_cache": True, "timeout": 7, "nli_provider": "CPU", "hypothesis": "answer",
        "entail_threshold": 0.7, "variant": "binary_gap", "on_failed_check": "zero",
        "engine_slots": "4",
    }))  # fmt: skip
    config, options = reward_config(path)
    assert config == flags
    assert config.tree == TreeConfig(hypothesis="answer", entail_threshold=0.7)
    assert options == RewardOptions(variant="binary_gap", on_failed_check="zero")
    assert reward_options(_serve("--variant", "binary_gap", "--on-failed-check", "zero")) == options
    assert config.judge_options()["cache"] is False and config.timeout == 7.0


def test_a_misspelt_reward_file_key_is_named_with_the_key_it_was_likely_meant_to_be(tmp_path):
    import pytest

    path = tmp_path / "reward.json"
    path.write_text('{"judge": "openai:m",\n "entail_treshold": 0.7}')
    with pytest.raises(ValueError) as raised:
        reward_config(path)
    said = str(raised.value)
    assert said.startswith(f"{path}:2: entail_treshold: a reward configuration has no such key")
    assert "(did you mean entail_threshold? keys: " in said
    path.write_text('{"zzz": 1}')
    with pytest.raises(ValueError, match="no such key \\(keys: "):  # nothing close: no guess
        reward_config(path)


def test_a_count_below_one_is_its_flags_one_line_error(tmp_path, capsys):
    """Counts (batch sizes, limits, concurrency, token budgets) refuse 0, a negative number and
    a non-number at the flag, as argparse errors do, on the command line and in a --config file,
    instead of failing inside the run (`range() arg 3 must not be zero`)."""
    import pytest

    from stepgap.cli import main

    ex = "examples"
    base = ["check", f"{ex}/traces.jsonl", "--judge", f"replay:{ex}/judge_replay.jsonl",
            "--nli", f"replay:{ex}/nli_replay.jsonl", "-o", str(tmp_path / "v.jsonl")]  # fmt: skip
    for flag, value, message in (
        ("--batch-size", "0", "argument --batch-size: must be at least 1, got 0"),
        ("--judge-batch-size", "0", "argument --judge-batch-size: must be at least 1, got 0"),
        ("--concurrency", "-2", "argument --concurrency: must be at least 1, got -2"),
        ("--max-tokens", "0", "argument --max-tokens: must be at least 1, got 0"),
        ("--concurrency", "2x", "argument --concurrency: expected a whole number, got '2x'"),
        ("--kv-cache-gib", "-1", "argument --kv-cache-gib: must be more than 0, got -1"),
        ("--kv-cache-gib", "0", "argument --kv-cache-gib: must be more than 0, got 0"),
        ("--kv-cache-gib", "2g", "argument --kv-cache-gib: expected a number, got '2g'"),
    ):
        with pytest.raises(SystemExit) as stop:
            main([*base, flag, value])
        assert stop.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message)
    config = tmp_path / "check.yaml"
    config.write_text("concurrency: 4\nbatch_size: 0\n")
    assert main([*base, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{config}:2: batch_size: 0 is not a valid value (must be at least 1, got 0)" in err
    assert not (tmp_path / "v.jsonl").exists()
    config.write_text("kv_cache_gib: -1\n")
    assert main([*base, "--config", str(config)]) == 2
    assert f"{config}:1: kv_cache_gib: " in capsys.readouterr().err
    assert build_parser().parse_args([*base, "--batch-size", "3"]).batch_size == 3
    assert build_parser().parse_args([*base, "--kv-cache-gib", "1.5"]).kv_cache_gib == 1.5


def test_a_judge_flag_its_judge_does_not_take_is_named_as_a_flag(tmp_path, capsys):
    """`--engine` with a judge on a server is one line naming the flag and the flags that judge
    takes, not the backend's internal option names."""
    from stepgap.cli import main

    ex = "examples"
    base = ["check", f"{ex}/traces.jsonl", "-o", str(tmp_path / "v.jsonl")]
    assert main([*base, "--judge", "openai:m", "--nli", f"replay:{ex}/nli_replay.jsonl",
                 "--engine", "vllm"]) == 2  # fmt: skip
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("stepgap check: error: --engine does not apply to the judge openai:m")
    assert "(its flags: --base-url, --api-key-env, " in line and "--judge-device" not in line
    assert "on_result" not in line and "meter" not in line
    bundle = "tests/export/made_before/bundle"
    assert main([*base, "--bundle", bundle, "--base-url", "http://127.0.0.1:9/v1"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--base-url does not apply to the judge of --bundle {bundle}" in line
    assert "--judge-device" in line and "--max-tokens" in line and "--engine" in line
    assert not (tmp_path / "v.jsonl").exists()
