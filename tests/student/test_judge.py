"""The student judge backend: its schema, answer parsing, and loading by spec."""

from __future__ import annotations

import json

import pytest

from stepgap.data_builders.student_target import STUDENT_KEYS, student_json_schema, student_target
from stepgap.schema import LABELS
from stepgap.student.judge import StudentJudge, is_adapter
from stepgap.teacher.judges.base import JudgeParseError, judge_json_schema
from stepgap.teacher.judges.constrained import judge_regex
from stepgap.teacher.judges.hf import StudentJudgeOptions
from stepgap.teacher.judges.openai_api import OpenAIJudgeOptions
from stepgap.tree import PATH_TOKENS


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

    from stepgap.io import read_models
    from stepgap.schema import Verdict

    pattern = re.compile(judge_regex(schema=student_json_schema()))
    verdicts = [v for _, v in read_models(examples_dir / "teacher_verdicts.jsonl", Verdict)]
    assert verdicts
    for v in verdicts:
        assert pattern.fullmatch(student_target(v)), (v.trace_id, v.step)


def test_parse_splits_off_the_students_path_and_label(examples_dir):
    from stepgap.io import read_models
    from stepgap.schema import Verdict

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
    from stepgap.segment import iter_traces
    from stepgap.teacher import Checker, load_nli
    from stepgap.teacher.judges import ReplayJudge

    class Recorder(ReplayJudge):
        def judge(self, requests, *, stop=None):
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


def test_mining_needs_an_nli_model(examples_dir, capsys):
    """Mining compares the checker that ships, whose stages D-E are NLI: no --nli, no run."""
    from stepgap.cli import main

    argv = ["mine", str(examples_dir / "teacher_verdicts.jsonl"), "--student", "x", "-o", "y"]
    assert main(argv) == 2 and "--nli" in capsys.readouterr().err


def _reasoning(judge) -> list[str]:
    """The judge object's reasoning strings (empty for a compact student's answer)."""
    from stepgap.data_builders.student_target import REASONING_FIELDS

    dumped = judge.model_dump()
    return [dumped[stage][name] for stage, names in REASONING_FIELDS.items() for name in names]


@pytest.mark.slow
def test_a_tiny_student_trained_on_the_compact_target_writes_and_parses_it(
    tmp_path, examples_dir, example_traces
):
    """`sft-data --target compact` -> the tiny recipe (6 steps): the student's metadata says
    compact, so it decodes under the compact schema and its answers parse into judge objects
    (empty reasoning) with its own path and label."""
    from stepgap.cli import main
    from stepgap.student.judge import student_meta
    from stepgap.student.recipe import load_config
    from stepgap.student.trainer import train
    from stepgap.teacher.prompt import build_requests

    from .conftest import TINY

    data, out = tmp_path / "compact", tmp_path / "student"
    assert main(["sft-data", str(examples_dir / "teacher_verdicts.jsonl"), "-o", str(data),
                 "--eval-fraction", "0", "--target", "compact"]) == 0  # fmt: skip
    settings = {"output_dir": str(out), "dataset": str(data), "max_steps": 6}
    train(load_config(TINY, {**settings, "max_train_examples": 12}))
    assert student_meta(out)["target"] == "compact"
    judge = StudentJudge(
        str(out), StudentJudgeOptions(judge_batch_size=8, max_tokens=256, max_string_chars=60)
    )
    assert judge.target == "compact" and judge.schema() == student_json_schema("compact")
    requests = [r for t in example_traces[:3] for r in build_requests(t.id, t.question, t.steps)]
    results = judge.judge(requests)
    assert all(r.judge is not None for r in results), [r.error for r in results]
    assert all(_reasoning(r.judge) == [""] * 4 for r in results)
    assert all(r.extra["gap_type"] in LABELS and r.extra["pipeline_path"] for r in results)


def test_a_served_compact_student_is_asked_and_parsed_in_its_schema(
    monkeypatch, tmp_path, examples_dir, example_traces, pool
):
    """`check --bundle B --judge openai:NAME` for a bundle whose student metadata says compact:
    the served judge asks the test server for the compact schema and parses its compact answers
    (the teacher's targets here) into judge objects that the tree decides as the teacher did."""
    from types import SimpleNamespace

    from stepgap.export import OfflineChecker, load_checker
    from stepgap.teacher import Checker, CheckerConfig, ReplayNLI
    from stepgap.teacher.prompt import build_requests
    from tests.fixtures.openai_server import FakeOpenAI, prompt_key

    teacher = {(v.trace_id, v.step): v for v in pool}
    answers = {
        prompt_key(r.messages): json.loads(student_target(teacher[(r.trace_id, r.step)], "compact"))
        for t in example_traces
        for r in build_requests(t.id, t.question, t.steps)
    }
    # the bundle part is not under test here: load_checker's served judge reads the student's
    # metadata from the bundle's student folder, as OfflineChecker.from_bundle hands it over
    (tmp_path / "stepgap_student.json").write_text('{"target": "compact"}')
    bundle = SimpleNamespace(student_dir=tmp_path)
    monkeypatch.setattr(
        OfflineChecker,
        "from_bundle",
        classmethod(lambda cls, path, served_judge, **kw: served_judge(bundle)),
    )
    server = FakeOpenAI(answers=answers).start()
    try:
        config = CheckerConfig(bundle="bundle", judge="openai:stepgap-student",
                               base_url=server.base_url, no_cache=True)  # fmt: skip
        judge = load_checker(config)
        assert judge.target == "compact"
        nli = ReplayNLI.from_file(examples_dir / "nli_replay.jsonl")
        verdicts = [v for vs in Checker(judge, nli).check(example_traces) for v in vs]
    finally:
        server.stop()
    schema = server.response_formats[0]["json_schema"]["schema"]
    assert schema == student_json_schema("compact")
    assert len(verdicts) == len(pool) == 28
    for v in verdicts:
        want = teacher[(v.trace_id, v.step)]
        assert (v.label, v.path) == (want.label, want.path), (v.trace_id, v.step, v.error)
        assert _reasoning(v.judge) == [""] * 4


def test_a_served_student_without_a_readable_tokenizer_is_asked_unchecked(tmp_path, caplog):
    """A bundle whose `student/` tokenizer does not load (no chat template, a broken file)
    still asks its served student, as before the tokenizer check, and says it is not checked."""
    from stepgap.student.judge import ServedStudentJudge

    (tmp_path / "tokenizer_config.json").write_text("{}")
    judge = ServedStudentJudge(
        "m", OpenAIJudgeOptions(base_url="http://127.0.0.1:9/v1"), tokenizer=str(tmp_path)
    )
    assert judge.tokenizer is None and judge.tokens_checked
    assert "the served student's tokens are not checked" in caplog.text


def test_an_adapter_with_a_relative_base_loads_from_any_folder(tmp_path, monkeypatch, hub_offline):
    """`student:/abs/path/student` from another folder: its base `student/tiny-base` is found
    above the adapter, not asked of the Hub."""
    from stepgap.student.judge import adapter_base, load_student
    from tests.fixtures.models import build_tiny_adapter

    adapter = build_tiny_adapter(tmp_path / "project" / "student", "student/tiny-base")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    tokenizer, model = load_student(str(adapter), device="cpu")
    assert model.config.vocab_size == len(tokenizer)
    assert adapter_base(adapter) == str(adapter / "tiny-base")
    assert adapter_base(adapter, "my/base") == "my/base"  # the base given wins


def test_a_base_an_adapter_names_but_nobody_has_is_one_line_saying_how_to_give_it(
    tmp_path, monkeypatch
):
    from stepgap.student.judge import ADAPTER_CONFIG, adapter_base

    adapter = tmp_path / "student"
    adapter.mkdir()
    config = adapter / ADAPTER_CONFIG
    for recorded in ("gone/tiny-base/x", str(tmp_path / "gone")):
        config.write_text(json.dumps({"base_model_name_or_path": recorded}))
        with pytest.raises(FileNotFoundError) as err:
            adapter_base(adapter)
        message = str(err.value)
        assert f"names its base {recorded}, which is not found" in message
        assert "--student-base" in message and "\n" not in message
    # a tiny student's base is a folder it built: `student/tiny-base` found nowhere is no hub id
    (adapter / "stepgap_student.json").write_text(json.dumps({"base_model": "tiny-random:qwen2"}))
    config.write_text(json.dumps({"base_model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct"}))
    assert adapter_base(adapter) == "Qwen/Qwen2.5-0.5B-Instruct"  # a hub id stays one
    config.write_text(json.dumps({"base_model_name_or_path": "student/tiny-base"}))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="names its base student/tiny-base, which is not"):
        adapter_base(adapter)
