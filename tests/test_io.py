"""Record readers and the crash-safe JSONL writer."""

from __future__ import annotations

import json

import pytest

from stepgap.io import ErrorReport, JsonlWriter, read_models, read_records
from stepgap.schema import Trace


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


def test_a_line_cut_short_is_said_to_be_cut(tmp_path):
    """A line cut inside a string reads as an unterminated string, not as a control character
    (the line end json would otherwise see inside the string)."""
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"id": "t", "question": "who\r\n{"a": 2}\n')
    report = ErrorReport()
    assert [line for line, _ in read_records(path, report)] == [1, 3]
    assert [str(e) for e in report.errors] == [
        f"{path}:2: invalid JSON: Unterminated string starting at (column 25)"
    ]


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


def test_a_folder_output_is_replaced_whole_only_when_the_run_ends_well(tmp_path):
    from stepgap.io import replacing

    out = tmp_path / "report"
    out.mkdir()
    (out / "report.json").write_text("old")
    (out / "old.png").write_text("old plot")
    with pytest.raises(KeyboardInterrupt), replacing(out, folder=True, owned_by="report.json") as w:
        (w / "report.json").write_text("new")
        raise KeyboardInterrupt  # Ctrl-C mid-run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]
    assert {p.name: p.read_text() for p in out.iterdir()} == {"report.json": "old", "old.png": "old plot"}  # fmt: skip
    with replacing(out, folder=True, owned_by="report.json") as w:
        (w / "report.json").write_text("new")
    assert {p.name: p.read_text() for p in out.iterdir()} == {"report.json": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]
    with pytest.raises(ValueError, match="is a folder with other files in it"):
        with replacing(tmp_path, folder=True, owned_by="manifest.json"):
            pass
    assert (out / "report.json").read_text() == "new"


@pytest.mark.parametrize(
    ("record", "model", "phrase"),
    [
        ({"id": "t", "question": "q", "response": "r"}, "Verdict", "is a traces file"),
        ({"trace_id": "t", "step": 0, "type": "conclusion", "label": "CC", "repair": "retract"},
         "Trace", "is a verdicts file"),
        ({"trace_id": "t", "step": 0, "label": "CC"}, "Verdict", "is a gold step labels file"),
        ({"premise": "p", "hypothesis": "h", "probs": {}}, "Trace", "is a NLI replay answers file"),
        ({"trace_id": "t", "variant": "v", "lam": 1, "em": 1, "reward": 1, "steps": []}, "Trace",
         "is a rewards file"),
    ],
)  # fmt: skip
def test_a_file_of_another_format_is_one_error_not_a_skipped_line_each(
    tmp_path, record, model, phrase
):
    from stepgap import schema
    from stepgap.io import WrongFormatError

    path = tmp_path / "x.jsonl"
    path.write_text("\n".join(json.dumps(record) for _ in range(50)) + "\n")
    report = ErrorReport()
    with pytest.raises(WrongFormatError, match=phrase):
        list(read_models(path, getattr(schema, model), report))
    assert len(report) == 0  # said once, as the error


def test_a_file_none_of_whose_records_can_be_read_is_an_error(tmp_path):
    from stepgap.io import UnreadableFileError

    path = tmp_path / "x.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b", "question": 3}\n')
    with pytest.raises(UnreadableFileError, match=r"x.jsonl: none of its 2 record\(s\) is traces"):
        list(read_models(path, Trace))
    path.write_text("not json\nnor this\n")
    with pytest.raises(UnreadableFileError, match="none of its lines is a JSON record"):
        list(read_records(path))
    path.write_text('{"id": "a", "question": "q", "response": "r"}\n{"id": "b"}\n')
    report = ErrorReport()
    assert [t.id for _, t in read_models(path, Trace, report)] == ["a"]  # some good: skipped
    assert [str(e) for e in report.errors] == [f"{path}:2: question: Field required"]


def test_a_validators_message_comes_without_pydantics_prefix(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"id": "a", "question": "q", "response": "r"}\n{"id": "b", "question": "q"}\n')
    report = ErrorReport()
    list(read_models(path, Trace, report))
    (error,) = report.errors
    assert error.reason.startswith("a trace needs") and "Value error" not in str(error)


def test_resume_keys_skip_a_half_written_last_line_and_refuse_a_foreign_one(tmp_path):
    """The resume reader of `label` and `rollouts`: what a killed run left is readable, and a
    file that is not theirs is never appended to."""
    from stepgap.data_builders.rollouts import finished_ids
    from stepgap.io import resume_keys
    from stepgap.teacher.label import verdict_status

    assert resume_keys(tmp_path / "none.jsonl", "trace", lambda r: r["id"]) == []
    traces = tmp_path / "traces.jsonl"
    traces.write_text('{"id": "a"}\n\n{"id": 7}\n{"id": "b", "resp', encoding="utf-8")
    assert finished_ids(traces) == {"a", "7"}
    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text(
        '{"trace_id": "a", "step": 0, "label": "CC"}\n{"trace_id": "a", "step": 1, "label": null}\n',
        encoding="utf-8",
    )
    assert verdict_status(verdicts) == {("a", 0): True, ("a", 1): False}
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"trace_id": "a", "step": 0}\n{"id": "a"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"mixed\.jsonl:2: not a verdict line; refusing to append"):
        verdict_status(mixed)
