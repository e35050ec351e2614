"""Record readers and the crash-safe JSONL writer."""

from __future__ import annotations

import json

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
