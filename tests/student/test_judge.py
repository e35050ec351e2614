"""The student judge backend: its schema, answer parsing, and loading by spec."""

from __future__ import annotations

import json

import pytest

from stepgap.data_builders.schema import LABELS
from stepgap.data_builders.sft import STUDENT_KEYS, student_target
from stepgap.student.judge import StudentJudge, is_adapter, student_json_schema
from stepgap.teacher.judges.base import JudgeParseError, judge_json_schema
from stepgap.teacher.judges.hf import judge_regex
from stepgap.teacher.tree import PATH_TOKENS


def test_student_schema_extends_the_judge_schema():
    schema = student_json_schema()
    teacher = judge_json_schema()
    assert list(schema["properties"])[: len(teacher["properties"])] == list(teacher["properties"])
    assert schema["properties"]["gap_type"]["enum"] == list(LABELS)
    assert set(schema["properties"]["pipeline_path"]["items"]["enum"]) == set(PATH_TOKENS)
    assert schema["required"][-2:] == list(STUDENT_KEYS)


def test_every_teacher_target_matches_the_constrained_regex(examples_dir):
    """What the student is trained to write is exactly what constrained decoding allows."""
    import re

    from stepgap.data_builders.io import read_models
    from stepgap.data_builders.schema import Verdict

    pattern = re.compile(judge_regex(schema=student_json_schema()))
    verdicts = [v for _, v in read_models(examples_dir / "teacher_verdicts.jsonl", Verdict)]
    assert verdicts
    for v in verdicts:
        assert pattern.fullmatch(student_target(v)), (v.trace_id, v.step)


def test_parse_splits_off_the_students_path_and_label(examples_dir):
    from stepgap.data_builders.io import read_models
    from stepgap.data_builders.schema import Verdict

    v = next(v for _, v in read_models(examples_dir / "teacher_verdicts.jsonl", Verdict))
    judge, extra = StudentJudge.parse(object.__new__(StudentJudge), student_target(v))
    assert judge == v.judge
    assert extra == {"pipeline_path": v.path, "gap_type": v.label}
    with pytest.raises(JudgeParseError):
        StudentJudge.parse(object.__new__(StudentJudge), json.dumps({"gap_type": "CC"}))
    with pytest.raises(JudgeParseError):
        StudentJudge.parse(object.__new__(StudentJudge), "[1, 2]")


def test_adapter_detection(tmp_path):
    assert not is_adapter(tmp_path)
    (tmp_path / "adapter_config.json").write_text("{}")
    assert is_adapter(tmp_path)


def test_checker_gives_a_features_student_its_nli_features(examples_dir, tiny_nli):
    """A judge that asks for NLI features gets them from the checker's own NLI model."""
    from stepgap.data_builders import iter_traces
    from stepgap.teacher import Checker, load_nli
    from stepgap.teacher.judges import ReplayJudge

    class Recorder(ReplayJudge):
        def judge(self, requests):
            self.seen = [r.messages[1]["content"] for r in requests]
            return super().judge(requests)

    class FeatureStudent(Recorder):
        nli_features = True

    traces = list(iter_traces(examples_dir / "traces.jsonl"))[:2]
    nli = load_nli(str(tiny_nli))
    student = FeatureStudent.from_file(examples_dir / "judge_replay.jsonl")
    teacher = Recorder.from_file(examples_dir / "judge_replay.jsonl")
    Checker(student, nli).check(traces)
    Checker(teacher, nli).check(traces)
    assert len(student.seen) == len(teacher.seen) == sum(len(t.steps) for t in traces)
    assert all('"nli_features"' in text for text in student.seen)
    assert not any('"nli_features"' in text for text in teacher.seen)


def test_mining_a_features_student_needs_an_nli_model(examples_dir):
    from stepgap.student.mining import compare

    class FeatureStudent:
        name = "x"
        nli_features = True

    with pytest.raises(ValueError, match="NLI features"):
        compare(FeatureStudent(), [])
