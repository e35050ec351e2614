"""`stepgap prepare-verl-data`: Search-R1's parquet, as its data scripts write it, gains
`extra_info.question` and keeps everything else."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stepgap.cli import main
from stepgap.data_builders.rollout_formats import SEARCH_R1_TEMPLATE

QUESTIONS = ["who wrote dracula?", "where is the eiffel tower?", "when was ibm founded?"]


def search_r1_rows(questions: list[str]) -> list[dict]:
    """Rows as `scripts/data_process/nq_search.py` in PeterGriffinJin/Search-R1 makes them."""
    return [
        {"data_source": "nq",
         "prompt": [{"role": "user", "content": SEARCH_R1_TEMPLATE.format(question=q)}],
         "ability": "fact-reasoning",
         "reward_model": {"style": "rule", "ground_truth": {"target": [f"answer {i}"]}},
         "extra_info": {"split": "train", "index": i}}
        for i, q in enumerate(questions)
    ]  # fmt: skip


def write(rows: list[dict], path: Path) -> Path:
    import datasets

    datasets.Dataset.from_list(rows).to_parquet(str(path))  # as the Search-R1 scripts write it
    return path


def test_the_question_is_added_and_every_other_row_and_column_kept(tmp_path, capsys):
    rows = search_r1_rows(QUESTIONS)
    rows[1]["prompt"] = [{"role": "user", "content": "Answer the given question: where is it?"}]
    src = write(rows, tmp_path / "train.parquet")
    out, errors = tmp_path / "train_q.parquet", tmp_path / "errors.jsonl"
    argv = ["prepare-verl-data", str(src), "-o", str(out), "--errors", str(errors)]
    assert main(argv) == 3  # done, with rows skipped

    before, after = pq.read_table(src), pq.read_table(out)
    assert after.column_names == before.column_names
    kept = [r for i, r in enumerate(before.to_pylist()) if i != 1]
    got = after.to_pylist()
    assert [r["extra_info"] for r in got] == [
        {"split": "train", "index": 0, "question": "who wrote dracula?"},
        {"split": "train", "index": 2, "question": "when was ibm founded?"},
    ]
    for r in got + kept:
        r.pop("extra_info")
    assert got == kept
    (err,) = [json.loads(line) for line in errors.read_text().splitlines()]
    assert (err["file"], err["line"], err["field"]) == (str(src), 2, "prompt")
    assert "no `Question:` line" in err["reason"]
    assert f"{src}:2: prompt:" in capsys.readouterr().err
    left = sorted(p.name for p in tmp_path.iterdir())  # no temporary file
    assert left == ["errors.jsonl", "train.parquet", "train_q.parquet"]

    import datasets  # what veRL's RLHFDataset reads the file with

    data = datasets.load_dataset("parquet", data_files=str(out), split="train")
    assert data[1]["extra_info"]["question"] == "when was ibm founded?"


def test_a_question_column_or_an_existing_question_is_used(tmp_path):
    rows = search_r1_rows(QUESTIONS[:2])
    for row, question in zip(rows, ["Who wrote Dracula", "Where is it?"], strict=True):
        row["question"] = question  # the FlashRAG column the Search-R1 scripts keep
    rows[1]["extra_info"]["question"] = "already here?"
    src = write(rows, tmp_path / "in.parquet")
    assert main(["prepare-verl-data", str(src), "-o", str(tmp_path / "out.parquet")]) == 0
    got = pq.read_table(tmp_path / "out.parquet").column("extra_info").to_pylist()
    assert [e["question"] for e in got] == ["Who wrote Dracula", "already here?"]


def test_refuses_the_input_as_output_and_writes_nothing_when_no_row_has_a_question(
    tmp_path, capsys
):
    src = write(search_r1_rows(QUESTIONS[:1]), tmp_path / "in.parquet")
    data = src.read_bytes()
    assert main(["prepare-verl-data", str(src), "-o", str(tmp_path / "." / "in.parquet")]) == 2
    assert "is also an input" in capsys.readouterr().err
    assert src.read_bytes() == data

    rows = search_r1_rows(QUESTIONS[:2])
    for row in rows:
        row["prompt"] = [{"role": "system", "content": "Question: not the user's?"}]
    bad = write(rows, tmp_path / "bad.parquet")
    out = tmp_path / "out.parquet"
    out.write_text("an earlier output")
    assert main(["prepare-verl-data", str(bad), "-o", str(out)]) == 2
    assert "bad.parquet: no row has a question; the first: " in capsys.readouterr().err
    assert out.read_text() == "an earlier output"
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["bad.parquet", "in.parquet", "out.parquet"]


def test_a_file_that_is_not_parquet_is_a_clear_error(tmp_path, capsys):
    src = tmp_path / "train.parquet"
    src.write_text("not parquet")
    assert main(["prepare-verl-data", str(src), "-o", str(tmp_path / "out.parquet")]) == 2
    assert f"{src}: not a readable Parquet file" in capsys.readouterr().err


@pytest.mark.parametrize("batch_size", [1, 2])
def test_rows_are_numbered_across_batches(tmp_path, batch_size):
    from stepgap.data_builders.verl_data import add_questions
    from stepgap.io import ErrorReport

    rows = search_r1_rows(QUESTIONS)
    rows[2]["prompt"] = [{"role": "user", "content": "no question line"}]
    report = ErrorReport()
    src = write(rows, tmp_path / "in.parquet")
    assert add_questions(src, tmp_path / "out.parquet", report, batch_size=batch_size) == 2
    assert [(e.line, e.field) for e in report.errors] == [(3, "prompt")]
