"""`--config FILE.yaml` and `--print-config` on every command (stepgap/arguments.py)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml

from stepgap.cli import commands, main

REPO = Path(__file__).resolve().parents[2]
EX = REPO / "examples"


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_every_command_takes_a_config_file_and_prints_its_config(capsys):
    for name, command in commands().items():
        flags = command.make_parser()._option_string_actions
        assert {"--config", "--print-config"} <= set(flags), name


def test_a_config_file_gives_the_same_output_as_the_flags(tmp_path, capsys):
    by_flags = tmp_path / "flags.jsonl"
    argv = [
        "check", str(EX / "traces.jsonl"), f"--judge=replay:{EX / 'judge_replay.jsonl'}",
        f"--nli=replay:{EX / 'nli_replay.jsonl'}", "--entail-threshold=0.9", "--ablate=E",
    ]  # fmt: skip
    assert main([*argv, "-o", str(by_flags)]) == 0
    config = _write(
        tmp_path / "check.yaml",
        {
            "input": str(EX / "traces.jsonl"),
            "output": str(tmp_path / "file.jsonl"),
            "judge": f"replay:{EX / 'judge_replay.jsonl'}",
            "nli": f"replay:{EX / 'nli_replay.jsonl'}",
            "entail-threshold": 0.9,  # dashes or underscores
            "ablate": "E",
        },
    )
    assert main(["check", "--config", str(config)]) == 0
    assert (tmp_path / "file.jsonl").read_bytes() == by_flags.read_bytes()
    labels = [json.loads(x)["label"] for x in by_flags.read_text().splitlines()]
    default = tmp_path / "default.jsonl"
    assert main(["check", "--config", str(config), "--entail-threshold=0.5", "--ablate=A",
                 "-o", str(default)]) == 0  # fmt: skip
    # the flags won: another output file, other labels
    assert not (tmp_path / "file.jsonl").read_bytes() == default.read_bytes()
    assert [json.loads(x)["label"] for x in default.read_text().splitlines()] != labels


def test_print_config_round_trips_and_runs_nothing(tmp_path, capsys):
    config = _write(
        tmp_path / "eval.yaml",
        {"gold": [str(EX / "gold_steps.jsonl")], "pred": ["a=x.jsonl", "b=y.jsonl"], "seed": 7},
    )
    assert main(["eval", "--config", str(config), "-o", str(tmp_path / "r"), "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert not (tmp_path / "r").exists()
    assert printed["seed"] == 7 and printed["resamples"] == 2000 and printed["unit"] == "step"
    assert printed["pred"] == ["a=x.jsonl", "b=y.jsonl"]
    assert printed["output"] == str(tmp_path / "r")
    # list flags on the command line replace the file's list, they do not extend it
    assert main(["eval", "--config", str(config), "-o", "r", "--pred", "c=z.jsonl",
                 "--print-config"]) == 0  # fmt: skip
    assert yaml.safe_load(capsys.readouterr().out)["pred"] == ["c=z.jsonl"]
    again = _write(tmp_path / "again.yaml", printed)
    assert main(["eval", "--config", str(again), "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == printed


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "input: a.jsonl\nzzz: 0.3\n",
            "bad.yaml:2: zzz: not a key of `stepgap relabel` (its keys: ",
        ),
        ("entail_threshold: lots\n", "bad.yaml:1: entail_threshold: 'lots' is not a valid value"),
        ("\n\nablate: B\n", "bad.yaml:3: ablate: 'B' is not one of A, E"),
        ("- a\n- b\n", "expected a mapping of option names to values"),
        (
            "input: a.jsonl\nentail_treshold: 0.3\n",
            "bad.yaml:2: entail_treshold: not a key of "
            "`stepgap relabel`; did you mean entail_threshold?",
        ),  # fmt: skip
        ("input: [a, b]\n", "bad.yaml:1: input: expected a single value"),
        ("errors: {x: 1}\n", "bad.yaml:1: errors: expected a single value"),
    ],
)
def test_a_config_that_does_not_fit_names_file_line_and_key(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    assert main(["relabel", "--config", str(bad), "-o", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.startswith("stepgap relabel: error: ")  # the command, as argparse's errors say


def test_a_missing_config_file_is_a_clear_error(tmp_path, capsys):
    assert main(["segment", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: file not found" in capsys.readouterr().err


def test_booleans_come_from_the_file_as_true_or_false(tmp_path, capsys):
    config = _write(tmp_path / "l.yaml", {"no_progress": True, "fsync": False, "limit": 3})
    assert main(["label", "x.jsonl", "-o", "y", "--judge=replay:j", "--nli=replay:n",
                 "--config", str(config), "--print-config"]) == 0  # fmt: skip
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (printed["no_progress"], printed["fsync"], printed["limit"]) == (True, False, 3)
    _write(config, {"no_progress": "yes"})
    assert main(["label", "x", "-o", "y", "--judge=replay:j", "--nli=replay:n",
                 "--config", str(config)]) == 2  # fmt: skip
    assert "expected true or false" in capsys.readouterr().err


def test_only_command_modules_and_the_parser_import_argparse():
    """Workflow code lives in the library; argument parsing only in the command modules and the
    one parser they share (stepgap/arguments.py)."""
    offenders = []
    for folder in ("stepgap", "data_builders", "teacher", "eval", "serving", "student", "export"):
        for path in (REPO / folder).rglob("*.py"):
            if path.parent.name == "cli" or path == REPO / "stepgap" / "arguments.py":
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                if "argparse" in names:
                    offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


EITHER_OR = {
    "mine": ["--bundle", "x"]
}  # --student with --nli, or --bundle: a check, not argparse's


def _required(name: str, parser) -> list[str]:
    """Values for what a command requires, so that it can print its configuration."""
    argv = list(EITHER_OR.get(name, []))
    for action in parser._actions:
        if action.option_strings and action.required:
            argv += [action.option_strings[0], "x"]
        elif not action.option_strings and action.nargs in (None, "+"):
            argv.append("x")
    return argv


def test_what_print_config_prints_every_command_reads_back(tmp_path, capsys):
    """`--print-config` writes every option, unset ones as null and lists as lists: each
    command's printed file, read back with --config, prints the same again (a null list once
    did not read back)."""
    for name, command in commands().items():
        if command.parser is not None:  # train: the recipe's keys (tests/student/test_recipe.py)
            continue
        assert (
            command.make_parser().parse([*_required(name, command.make_parser()), "--print-config"])
            is None
        )
        printed = capsys.readouterr().out
        again = tmp_path / f"{name}.yaml"
        again.write_text(printed)
        assert command.make_parser().parse(["--config", str(again), "--print-config"]) is None
        assert yaml.safe_load(capsys.readouterr().out) == yaml.safe_load(printed), name


def test_a_value_from_a_config_file_that_a_later_check_refuses_names_file_line_and_key(
    tmp_path, capsys
):
    bad = tmp_path / "bad.yaml"
    bad.write_text("\nentail_threshold: 7\n")
    out = tmp_path / "o.jsonl"
    argv = ["relabel", str(EX / "teacher_verdicts.jsonl"), "-o", str(out)]
    assert main([*argv, "--config", str(bad)]) == 2
    assert f"error: {bad}:2: entail_threshold must be in (0, 1]" in capsys.readouterr().err
    assert main([*argv, "--entail-threshold", "7"]) == 2  # from the command line: no file named
    err = capsys.readouterr().err
    assert "error: argument --entail-threshold: must be in (0, 1]" in err and str(bad) not in err
