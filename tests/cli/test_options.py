"""The checker's flags are the fields of `CheckerConfig`: one list of options, the same names and
defaults on the command line, in a `--config` file, in a reward worker's JSON file and in Python."""

from __future__ import annotations

import json

import pytest

from stepgap.cli import commands, main
from stepgap.options import Options
from stepgap.serving.process_reward import reward_config
from stepgap.serving.reward_function import RewardOptions
from stepgap.teacher import CheckerConfig
from stepgap.tree import TreeConfig


def _serve(*argv: str) -> tuple:
    return commands()["serve"].make_parser().parse(list(argv))


def test_every_field_has_its_flag_with_the_fields_default():
    """A backend's option is declared once, in its own options class: the checker's
    configuration holds it (each judge's, found by the judges' registry: no list to edit), and
    so `check`, `label`, `serve` and `baseline` have its flag."""
    import stepgap.student.judge  # noqa: F401 - registers `student:`
    from stepgap.registry import resolve
    from stepgap.teacher.build import JUDGE_OPTIONS, NLI_OPTIONS
    from stepgap.teacher.judges import JUDGES

    _, options, config, _ = _serve()
    assert config == CheckerConfig() and options == RewardOptions()
    judges = [resolve(entry).options_class for entry in JUDGES.own().values()]
    assert set(judges) - {Options} <= set(JUDGE_OPTIONS)
    for owner in (*judges, *NLI_OPTIONS, TreeConfig):
        assert issubclass(CheckerConfig, owner), owner
        assert set(owner.names()) <= set(CheckerConfig.names()), owner
    for command in ("check", "label", "serve", "baseline"):
        flags = commands()[command].make_parser()._option_string_actions
        for name in CheckerConfig.names():
            assert "--" + name.replace("_", "-") in flags and "--" + name in flags, name


def test_flags_the_reward_file_and_python_give_the_same_configuration(tmp_path):
    _, by_flags, flags, _ = _serve(
        "--judge", "openai:m", "--nli", "replay:n", "--base-url", "http://h/v1",
        "--concurrency", "3", "--no-cache", "--timeout", "7", "--nli-provider", "CPU",
        "--hypothesis", "answer", "--entail-threshold", "0.7", "--variant", "binary_gap",
        "--on-failed-check", "zero", "--engine-slots", "4",
    )  # fmt: skip
    path = tmp_path / "reward.json"
    path.write_text(json.dumps({
        "judge": "openai:m", "nli": "replay:n", "base-url": "http://h/v1", "concurrency": 3,
        "no_cache": True, "timeout": 7, "nli_provider": "CPU", "hypothesis": "answer",
        "entail_threshold": 0.7, "variant": "binary_gap", "on_failed_check": "zero",
        "engine_slots": "4",
    }))  # fmt: skip
    config, options = reward_config(path)
    python = CheckerConfig(
        judge="openai:m", nli="replay:n", base_url="http://h/v1", concurrency=3, no_cache=True,
        timeout=7.0, nli_provider=["CPU"], hypothesis="answer", entail_threshold=0.7,
        engine_slots="4",
    )  # fmt: skip
    assert config == flags == python
    assert config.tree == TreeConfig(hypothesis="answer", entail_threshold=0.7)
    assert options == by_flags == RewardOptions(variant="binary_gap", on_failed_check="zero")
    assert config.no_cache and config.timeout == 7.0


def test_a_misspelt_reward_file_key_is_named_with_the_key_it_was_likely_meant_to_be(tmp_path):
    path = tmp_path / "reward.json"
    path.write_text('{"judge": "openai:m",\n "entail_treshold": 0.7}')
    with pytest.raises(ValueError) as raised:
        reward_config(path)
    said = str(raised.value)
    assert said == (
        f"{path}:2: entail_treshold: not a key of a reward configuration; did you mean "
        "entail_threshold?"
    )
    path.write_text('{"zzz": 1}')
    with pytest.raises(ValueError, match="not a key of a reward configuration \\(its keys: "):
        reward_config(path)  # nothing close: the keys, no guess


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as stop:  # argparse's own error for a value its type refuses
        return int(stop.code or 0)


def test_a_count_below_one_is_its_flags_one_line_error(tmp_path, capsys):
    """Counts (batch sizes, limits, concurrency, token budgets) refuse 0, a negative number and
    a non-number at the flag, on the command line and in a --config file, instead of failing
    inside the run (`range() arg 3 must not be zero`)."""
    ex = "examples"
    base = ["check", f"{ex}/traces.jsonl", "--judge", f"replay:{ex}/judge_replay.jsonl",
            "--nli", f"replay:{ex}/nli_replay.jsonl", "-o", str(tmp_path / "v.jsonl")]  # fmt: skip
    for flag, value, message in (
        ("--batch-size", "0", "argument --batch-size: must be at least 1, got 0"),
        ("--judge-batch-size", "0", "argument --judge-batch-size: must be at least 1, got 0"),
        ("--concurrency", "-2", "argument --concurrency: must be at least 1, got -2"),
        ("--max-tokens", "0", "argument --max-tokens: must be at least 1, got 0"),
        ("--concurrency", "2x", "argument --concurrency: invalid int value: '2x'"),
        ("--kv-cache-gib", "-1", "argument --kv-cache-gib: must be more than 0, got -1.0"),
        ("--kv-cache-gib", "0", "argument --kv-cache-gib: must be more than 0, got 0.0"),
        ("--kv-cache-gib", "2g", "argument --kv-cache-gib: invalid float value: '2g'"),
    ):
        assert _exit_code([*base, flag, value]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message), flag
    config = tmp_path / "check.yaml"
    config.write_text("concurrency: 4\nbatch_size: 0\n")
    assert main([*base, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"error: {config}:2: batch_size must be at least 1, got 0" in err
    assert not (tmp_path / "v.jsonl").exists()
    config.write_text("kv_cache_gib: -1\n")
    assert main([*base, "--config", str(config)]) == 2
    assert f"{config}:1: kv_cache_gib must be more than 0" in capsys.readouterr().err
    parser = commands()["check"].make_parser()
    assert (
        parser.parse([*base[1:], "--batch-size", "3", "--kv-cache-gib", "1.5"])[0].batch_size == 3
    )


def test_a_judge_flag_its_judge_does_not_take_is_named_as_a_flag(tmp_path, capsys):
    """`--engine` with a judge on a server is one line naming the flag and the flags that judge
    takes, not the backend's internal option names."""
    ex = "examples"
    base = ["check", f"{ex}/traces.jsonl", "-o", str(tmp_path / "v.jsonl")]
    assert main([*base, "--judge", "openai:m", "--nli", f"replay:{ex}/nli_replay.jsonl",
                 "--engine", "vllm"]) == 2  # fmt: skip
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(
        "stepgap check: error: option engine (--engine) does not apply to the judge openai:m"
    )
    assert "; it takes: " in line and "base_url, api_key_env, " in line
    assert "judge_device" not in line and "on_result" not in line and "meter" not in line
    bundle = "tests/export/made_before/bundle"
    assert main([*base, "--bundle", bundle, "--base-url", "http://127.0.0.1:9/v1"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"option base_url (--base-url) does not apply to the judge of --bundle {bundle}" in line
    assert "judge_device" in line and "max_tokens" in line and "engine" in line
    assert main([*base, "--judge", f"replay:{ex}/judge_replay.jsonl", "--nli",
                 f"replay:{ex}/nli_replay.jsonl", "--nli-provider", "CPU"]) == 2  # fmt: skip
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "option nli_provider (--nli-provider) does not apply to the NLI model replay:" in line
    assert not (tmp_path / "v.jsonl").exists()


def test_python_callers_get_the_same_checks_as_the_flags():
    """The checks live in the options classes, so a value refused at the flag is refused when
    Python builds the configuration too, in one line naming the field."""
    for bad, message in (
        ({"concurrency": 0}, "concurrency must be at least 1, got 0"),
        ({"entail_threshold": 2.0}, "entail_threshold must be in (0, 1], got 2.0"),
        ({"engine": "tpu"}, "engine must be one of 'auto', 'vllm', 'hf', got 'tpu'"),
        ({"nli_provider": ["cuda:device_id"]}, "nli_provider 'cuda:device_id': provider options"),
    ):
        with pytest.raises(ValueError) as raised:
            CheckerConfig(**bad)
        assert str(raised.value).startswith(message) and "\n" not in str(raised.value)
