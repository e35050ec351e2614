"""Record readers and the crash-safe JSONL writer."""

from __future__ import annotations

import json

import pytest

from stepgap.data_builders import ErrorReport, JsonlWriter, Trace, read_models, read_records


def test_json_array_and_errors_per_field(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps(
            [
                {"id": "a", "question": "q", "response": "r"},
                3,
                {"id": "b", "question": "q", "steps": [{"index": -1}]},
            ]
        )
    )
    report = ErrorReport()
    got = [t.id for _, t in read_models(path, Trace, report)]
    assert got == ["a"]
    fields = {(e.line, e.field) for e in report.errors}
    assert (2, None) in fields
    assert (3, "steps.0.index") in fields and (3, "steps.0.type") in fields


def test_writer_append_drops_a_partial_last_line(tmp_path):
    path = tmp_path / "out.jsonl"
    with JsonlWriter(path) as w:
        w.write({"n": 1})
        w.write({"n": 2})
    with open(path, "a") as fh:
        fh.write('{"n": 3, "trunc')  # a process killed mid-write
    with JsonlWriter(path, append=True) as w:
        w.write({"n": 4})
    assert [r["n"] for _, r in read_records(path)] == [1, 2, 4]


def test_blank_lines_are_skipped_silently(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n\n   \n{"a": 2}\n')
    report = ErrorReport()
    assert [line for line, _ in read_records(path, report)] == [1, 4]
    assert not report


def test_an_overwrite_that_fails_leaves_the_old_file_whole_and_no_partial_file(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text('{"n": 0}\n')
    with pytest.raises(RuntimeError), JsonlWriter(path) as w:
        w.write({"n": 1})
        assert path.read_text() == '{"n": 0}\n'  # the new lines go elsewhere until done
        raise RuntimeError("the judge server went away")
    assert path.read_text() == '{"n": 0}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]
    with JsonlWriter(path) as w:  # a run that ends well replaces it
        w.write({"n": 2})
    assert [r["n"] for _, r in read_records(path)] == [2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_an_output_that_is_a_folder_or_an_input_is_refused(tmp_path):
    from stepgap.io import check_output

    with pytest.raises(ValueError, match="is a folder"):
        JsonlWriter(tmp_path)
    source = tmp_path / "traces.jsonl"
    source.write_text("{}\n")
    with pytest.raises(ValueError, match="is also an input"):
        check_output(tmp_path / "." / "traces.jsonl", source)
    assert check_output(tmp_path / "v.jsonl", source) == tmp_path / "v.jsonl"
