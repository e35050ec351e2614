"""The judge object: strict JSON schema for structured output, parsing that never guesses."""

from __future__ import annotations

import json

import pytest

from stepgap.teacher.judges import (
    JudgeParseError,
    build_judge,
    judge_json_schema,
    parse_judge,
    response_format,
)

from .helpers import judge


def _objects(node):
    if isinstance(node, dict):
        if node.get("type") == "object":
            yield node
        for v in node.values():
            yield from _objects(v)
    elif isinstance(node, list):
        for v in node:
            yield from _objects(v)


def test_schema_is_strict_mode_compatible():
    schema = judge_json_schema()
    assert "$defs" not in json.dumps(schema) and "$ref" not in json.dumps(schema)
    objs = list(_objects(schema))
    assert len(objs) == 4
    for obj in objs:
        assert obj["additionalProperties"] is False
        assert set(obj["required"]) == set(obj["properties"])
    drift = schema["properties"]["step_minus1_alignment"]["properties"]["drift_type"]
    assert set(drift["enum"]) == {"none", "entity_drift", "relation_drift", "scope_drift"}
    assert response_format()["json_schema"]["strict"] is True


def test_parse_valid_and_fenced():
    text = judge(found=True, quote="q").model_dump_json()
    assert parse_judge(text).step_1_quote_search.evidence_quote == "q"
    assert parse_judge(f"```json\n{text}\n```").step_1_quote_search.found_quote is True


@pytest.mark.parametrize(
    "text, match",
    [
        ("not json", "not JSON"),
        ('{"step_minus1_alignment": {}}', "violates the schema"),
        (judge().model_dump_json()[:-20], "not JSON"),  # truncated answer
    ],
)
def test_parse_failures_are_errors(text, match):
    with pytest.raises(JudgeParseError, match=match):
        parse_judge(text)


def _with_raw_control_characters(text: str) -> str:
    """The JSON text with its escaped newlines and tabs written raw, as llama-cpp-python's
    server answered ("Invalid control character" to a strict parser)."""
    raw = text.replace("\\n", "\n").replace("\\t", "\t")
    assert "\n" in raw and "\t" in raw
    with pytest.raises(json.JSONDecodeError, match="Invalid control character"):
        json.loads(raw)
    return raw


def test_raw_newlines_and_tabs_inside_strings_are_read_and_the_schema_still_holds():
    text = _with_raw_control_characters(
        judge(found=True, quote="line 1\nline 2\tend").model_dump_json()
    )
    assert parse_judge(text).step_1_quote_search.evidence_quote == "line 1\nline 2\tend"
    invalid = text.replace('"found_quote"', '"extra": "a\tb", "found_quote"', 1)
    with pytest.raises(JudgeParseError, match="step_1_quote_search.extra"):
        parse_judge(invalid)


def test_the_student_parser_reads_raw_control_characters_too():
    from stepgap.data_builders.student_target import parse_student_answer

    obj = json.loads(judge(quote="a\tquote").model_dump_json())
    obj["step_minus1_alignment"]["alignment_reasoning"] = "first\nsecond"
    obj.update(pipeline_path=["stageA:on_target"], gap_type="no_gap")
    parsed, extra = parse_student_answer(_with_raw_control_characters(json.dumps(obj)))
    assert parsed.step_minus1_alignment.alignment_reasoning == "first\nsecond"
    assert extra == {"pipeline_path": ["stageA:on_target"], "gap_type": "no_gap"}
    obj["step_minus1_alignment"]["drift_type"] = "topic_drift"
    with pytest.raises(JudgeParseError, match="drift_type"):
        parse_student_answer(_with_raw_control_characters(json.dumps(obj)))


def test_unknown_key_or_wrong_enum_is_rejected():
    obj = json.loads(judge().model_dump_json())
    obj["step_1_quote_search"]["extra"] = 1
    with pytest.raises(JudgeParseError, match="step_1_quote_search.extra"):
        parse_judge(json.dumps(obj))
    obj = json.loads(judge().model_dump_json())
    obj["step_minus1_alignment"]["drift_type"] = "topic_drift"
    with pytest.raises(JudgeParseError, match="drift_type"):
        parse_judge(json.dumps(obj))


def test_build_judge_rejects_unknown_specs():
    with pytest.raises(ValueError, match="unknown judge spec"):
        build_judge("nope:x")
