"""Nothing lost on a wrong input: every command that writes a file or folder, run on a file of
another of our formats (or failing for another reason), exits non-zero with one line and leaves
an earlier output byte for byte. Every output is written through `stepgap.io.replacing` (a
temporary file or folder renamed into place on success); resumable outputs (`label`,
`rollouts`) are appended to and must not change either.

`train` is the one command not here: its output folder holds the Trainer's checkpoints, written
as training goes so that `--resume` can continue from them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from stepgap.cli import main

REPO = Path(__file__).resolve().parents[2]
EX = REPO / "examples"
TRACES = str(EX / "traces.jsonl")
VERDICTS = str(EX / "teacher_verdicts.jsonl")
REPLAY = [f"--judge=replay:{EX / 'judge_replay.jsonl'}", f"--nli=replay:{EX / 'nli_replay.jsonl'}"]


def snapshot(path: Path) -> dict[str, str]:
    """Every file under `path` (or `path` itself) -> sha256 of its bytes."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}  # fmt: skip


def earlier_file(out: Path) -> None:
    out.write_text('{"an": "earlier output"}\n')


def earlier_folder(marker: str):
    def make(out: Path) -> None:
        out.mkdir()
        (out / marker).write_text('{"an": "earlier output"}\n')
        (out / "part").mkdir()
        (out / "part" / "data.bin").write_bytes(bytes(range(256)))

    return make


def earlier_traces(out: Path) -> None:
    out.write_bytes(b"".join((EX / "traces.jsonl").read_bytes().splitlines(keepends=True)[:3]))


def earlier_verdicts(out: Path) -> None:
    out.write_bytes((EX / "teacher_verdicts.jsonl").read_bytes()[:5000].rsplit(b"\n", 1)[0] + b"\n")


# name -> (argv with {out} for the output path, how the earlier output is made, a phrase of
# the error). Each input is a file of another format than the command reads, unless noted.
CASES = {
    "segment": (["segment", VERDICTS, "-o", "{out}"], earlier_file, "is a verdicts file"),
    "check": (["check", VERDICTS, *REPLAY, "-o", "{out}"], earlier_file, "is a verdicts file"),
    "label (appends)": (["label", VERDICTS, *REPLAY, "--no-progress", "-o", "{out}"],
                        earlier_verdicts, "is a verdicts file"),
    "relabel": (["relabel", TRACES, "-o", "{out}"], earlier_file, "is a traces file"),
    "merge": (["merge", TRACES, "-o", "{out}"], earlier_file, "is a traces file"),
    "baseline": (["baseline", "flag-everything", VERDICTS, "-o", "{out}"], earlier_file,
                 "is a verdicts file"),
    "eval": (["eval", f"--gold={TRACES}", f"--pred=a={VERDICTS}", "-o", "{out}"],
             earlier_folder("report.json"), "is a traces file"),
    "reward": (["reward", TRACES, "--verdicts", TRACES, "-o", "{out}"], earlier_file,
               "is a traces file"),
    "view": (["view", TRACES, f"--verdicts={TRACES}", "-o", "{out}"], earlier_file,
             "is a traces file"),
    "sft-data": (["sft-data", TRACES, "-o", "{out}"], earlier_folder("stepgap_sft.json"),
                 "is a traces file"),
    "mine": (["mine", TRACES, "--student", str(EX), f"--nli=replay:{EX / 'nli_replay.jsonl'}",
              "-o", "{out}"], earlier_folder("summary.json"), "is a traces file"),
    "rollouts (appends)": (["rollouts", VERDICTS, "--policy=openai:m", "--base-url=http://127.0.0.1:9/v1",
                            "--retriever=http://127.0.0.1:9/retrieve", "-o", "{out}"],
                           earlier_traces, "is a verdicts file"),
    "index": (["index", VERDICTS, "--kind=bm25", "-o", "{out}"], earlier_folder("other.json"),
              "is a verdicts file"),
    # a student that is not there: the bundle already there is left as it was
    "export": (["export", "--student", "no/such/student", "--nli", "no/such/nli", "-o", "{out}",
                "--overwrite"], earlier_folder("manifest.json"), "no/such"),
    "prepare-verl-data": (["prepare-verl-data", TRACES, "-o", "{out}"], earlier_file, "Parquet"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_a_failed_run_leaves_the_earlier_output_byte_for_byte(name, tmp_path, capsys):
    argv, make_earlier, phrase = CASES[name]
    out = tmp_path / "out"
    make_earlier(out)
    before = snapshot(out)
    rc = main([a.replace("{out}", str(out)) for a in argv])
    err = capsys.readouterr().err
    assert rc not in (0, 3), err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and phrase in errors[0], err
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary file left


def test_an_output_that_is_an_input_is_refused_before_any_work(tmp_path, capsys):
    copy = tmp_path / "traces.jsonl"
    copy.write_bytes((EX / "traces.jsonl").read_bytes())
    before = copy.read_bytes()
    for argv in (
        ["segment", str(copy), "-o", str(copy)],
        ["check", str(copy), *REPLAY, "-o", str(copy)],
        ["label", str(copy), *REPLAY, "-o", str(copy)],
        ["baseline", "flag-everything", str(copy), "-o", str(copy)],
        ["view", str(copy), f"--verdicts={VERDICTS}", "-o", str(copy)],
    ):
        assert main(argv) == 2, argv
        assert "is also an input" in capsys.readouterr().err, argv
        assert copy.read_bytes() == before


def test_check_where_every_step_failed_keeps_the_earlier_verdicts(tmp_path, capsys):
    """A judge that answered, but for no step of these traces: every check fails (exit 1)."""
    others = tmp_path / "other_judge.jsonl"
    with others.open("w") as fh:
        for line in (EX / "judge_replay.jsonl").read_text().splitlines():
            record = json.loads(line)
            fh.write(json.dumps({**record, "trace_id": "other-" + record["trace_id"]}) + "\n")
    out = tmp_path / "v.jsonl"
    earlier_file(out)
    rc = main(["check", TRACES, f"--judge=replay:{others}",
               f"--nli=replay:{EX / 'nli_replay.jsonl'}", "-o", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "every step failed" in err and f"{out} was left as it was" in err, err
    assert out.read_text() == '{"an": "earlier output"}\n'


def test_a_whole_run_replaces_a_folder_output_and_nothing_of_the_old_one_stays(tmp_path):
    out = tmp_path / "report"
    earlier_folder("report.json")(out)
    assert main(["eval", f"--gold={EX / 'gold_steps.jsonl'}", f"--pred=a={VERDICTS}",
                 "--no-plots", "--resamples=50", "-o", str(out)]) == 0  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]
    assert json.loads((out / "report.json").read_text())["checkers"]["a"]["n_scored"] > 0


def test_a_folder_of_other_files_is_refused_never_deleted(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    assert main(["eval", f"--gold={EX / 'gold_steps.jsonl'}", f"--pred=a={VERDICTS}",
                 "--no-plots", "--resamples=50", "-o", str(out)]) == 2  # fmt: skip
    assert "is a folder with other files in it" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "my notes"


# name -> argv with {empty} for the input with no records (the others are real files)
EMPTY_INPUT_CASES = {
    "segment": ["segment", "{empty}", "-o", "{out}"],
    "check": ["check", "{empty}", *REPLAY, "-o", "{out}"],
    "relabel": ["relabel", "{empty}", "-o", "{out}"],
    "reward (traces)": ["reward", "{empty}", "--verdicts", VERDICTS, "-o", "{out}"],
    "reward (verdicts)": ["reward", TRACES, "--verdicts", "{empty}", "-o", "{out}"],
    "merge": ["merge", "{empty}", "-o", "{out}"],
    "baseline": ["baseline", "flag-everything", "{empty}", "-o", "{out}"],
}


@pytest.mark.parametrize("content", [b"", b"\n  \n"], ids=["zero bytes", "blank lines"])
@pytest.mark.parametrize("name", list(EMPTY_INPUT_CASES))
def test_an_input_with_no_records_is_an_error_and_the_earlier_output_stays(
    name, content, tmp_path, capsys
):
    """`: > empty.jsonl` then `check empty.jsonl -o v.jsonl` wrote 0 verdicts over 28 and
    exited 0: a file with no records is an input error, like one none of whose records reads."""
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(content)
    out = tmp_path / "out.jsonl"
    earlier_file(out)
    argv = [
        a.replace("{out}", str(out)).replace("{empty}", str(empty)) for a in EMPTY_INPUT_CASES[name]
    ]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and str(empty) in errors[0] and "has no records" in errors[0], err
    assert out.read_text() == '{"an": "earlier output"}\n'
    assert "wrote" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl", "out.jsonl"]


def test_segment_writes_parquet_for_a_parquet_name_and_the_others_refuse_one(tmp_path, capsys):
    """`segment -o out.parquet` writes Parquet, which every reader takes back (the same
    verdicts as from JSON Lines); a command that writes JSON Lines refuses a Parquet name in one
    line, before any work, instead of writing JSON Lines into it."""
    table = tmp_path / "segmented.parquet"
    assert main(["segment", TRACES, "-o", str(table)]) == 0
    assert table.read_bytes()[:4] == b"PAR1"
    from_parquet, from_jsonl = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert main(["check", str(table), *REPLAY, "-o", str(from_parquet)]) == 0
    assert main(["check", TRACES, *REPLAY, "-o", str(from_jsonl)]) == 0
    assert sorted(from_parquet.read_text().splitlines()) == sorted(
        from_jsonl.read_text().splitlines()
    )
    capsys.readouterr()
    refused = tmp_path / "verdicts.parquet"
    for argv in (
        ["check", TRACES, *REPLAY, "-o", str(refused)],
        ["relabel", VERDICTS, "-o", str(refused)],
        ["reward", TRACES, "--verdicts", VERDICTS, "-o", str(refused)],
    ):
        assert main(argv) == 2
        assert "a Parquet name, but this command writes JSON Lines" in capsys.readouterr().err
        assert not refused.exists()
