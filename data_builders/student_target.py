"""The student's output format, its writer and its reader side by side.

The student writes the teacher's judge JSON extended with the path and label the tree gave
(`pipeline_path`, `gap_type`): `student_target` writes it from a teacher verdict (the SFT
completion), `student_json_schema` holds decoding to it, and `parse_student_answer` reads it
back into the judge object the tree takes plus the student's own path and label. The `compact`
target leaves out the judge's free-text reasoning (the tree reads none of it).
"""

from __future__ import annotations

import json
from typing import Any, Literal, get_args

from stepgap.schema import LABELS, Judge, Verdict
from stepgap.teacher.judges.base import JudgeParseError, judge_json_schema, parse_judge
from stepgap.tree import PATH_TOKENS

STUDENT_KEYS = ("pipeline_path", "gap_type")  # what the student adds to the judge object
# What the student writes: "full" is the teacher's judge JSON (the paper's), "compact" drops the
# judge's free-text reasoning and keeps what the tree reads (decisions, the verbatim quote).
Target = Literal["full", "compact"]
TARGETS: tuple[str, ...] = get_args(Target)
# The judge's free-text fields, per stage, that the compact target leaves out (the tree reads
# none of them; `evidence_quote` is kept: stage D's premise).
REASONING_FIELDS = {
    "step_minus1_alignment": ("alignment_reasoning",),
    "step_0_abstention_check": ("abstention_reasoning",),
    "step_1_quote_search": ("entity_match_reasoning", "quote_search_reasoning"),
}


def check_target(target: str, where: str = "target") -> str:
    """`target` if it names a known target kind, else a ValueError that says where it came from."""
    if target not in TARGETS:
        raise ValueError(
            f"{where}: unknown student target {target!r} (one of {', '.join(TARGETS)})"
        )
    return target


def judge_decisions(judge: Judge) -> dict[str, Any]:
    """The judge object without its reasoning strings: all the tree reads (the compact target's
    judge part), so two judges decide alike exactly when these are equal."""
    obj = judge.model_dump(mode="json")
    for stage, fields in REASONING_FIELDS.items():
        for name in fields:
            del obj[stage][name]
    return obj


def student_target(verdict: Verdict, target: str = "full") -> str:
    """The judge JSON (all of it, or its decisions and quote for `compact`) plus the teacher's
    path and label, as the student should write it."""
    check_target(target)
    if verdict.judge is None or verdict.label is None:
        raise ValueError(f"trace {verdict.trace_id!r} step {verdict.step}: no teacher judge/label")
    judge = verdict.judge
    obj = judge.model_dump(mode="json") if target == "full" else judge_decisions(judge)
    obj["pipeline_path"] = list(verdict.path)
    obj["gap_type"] = verdict.label
    return json.dumps(
        obj, ensure_ascii=False, separators=(",", ":")
    )  # as constrained decoding writes it


def student_json_schema(target: str = "full") -> dict[str, Any]:
    """The teacher's judge schema (without its reasoning fields for the `compact` target) plus
    the student's `pipeline_path` and `gap_type`."""
    schema = judge_json_schema()
    if check_target(target) == "compact":
        for stage, fields in REASONING_FIELDS.items():
            node = schema["properties"][stage]
            for name in fields:
                del node["properties"][name]
            node["required"] = [k for k in node["required"] if k not in fields]
    schema["properties"]["pipeline_path"] = {
        "type": "array",
        "items": {"type": "string", "enum": list(PATH_TOKENS)},
        "minItems": 1,
        "maxItems": 5,
    }
    schema["properties"]["gap_type"] = {"type": "string", "enum": list(LABELS)}
    schema["required"] = [*schema["required"], *STUDENT_KEYS]
    return schema


def parse_student_answer(text: str, target: str = "full") -> tuple[Judge, dict[str, Any]]:
    """The judge object, and the student's own path and label split off from it. A `compact`
    answer becomes the same judge object with empty reasoning strings, so the tree, verdicts,
    mining and export take it as they take a full one."""
    check_target(target)
    try:
        obj = json.loads(text, strict=False)  # as parse_judge: raw control characters in strings
    except json.JSONDecodeError:
        return parse_judge(text), {}  # raises with the position
    if not isinstance(obj, dict):
        raise JudgeParseError("student answer is not a JSON object")
    claims = {key: obj.pop(key, None) for key in STUDENT_KEYS}
    if target == "compact":
        for stage, fields in REASONING_FIELDS.items():
            node = obj.get(stage)
            if not isinstance(node, dict):
                continue  # parse_judge names what is wrong with it
            for name in fields:
                if name in node:
                    raise JudgeParseError(
                        f"compact student answer has {stage}.{name}: the compact target "
                        "carries no reasoning (was this student trained on the full target?)"
                    )
                node[name] = ""
    return parse_judge(json.dumps(obj)), claims
