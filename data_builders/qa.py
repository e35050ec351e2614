"""QA sets in: questions, their answers and ids, from the layouts multi-hop QA sets ship in.

`stepgap rollouts` needs (id, question, golden answers) per row. Each known layout names them
differently; each field is read from the first of its known places that a row has (`PATHS`),
or from where a `--columns` mapping says:

- Search-R1 parquet (`scripts/data_process/qa_search_*_merge.py` in PeterGriffinJin/Search-R1):
  `prompt` (chat messages holding the full prompt), `reward_model.ground_truth.target`,
  `extra_info.index` / `extra_info.split`, and often the FlashRAG columns it was built from.
- FlashRAG (`RUC-NLPIR/FlashRAG_datasets`): `id`, `question`, `golden_answers`.
- HotpotQA and 2WikiMultihopQA: `_id` (or `id`), `question`, `answer`.
- MuSiQue: `id`, `question`, `answer`, `answer_aliases`.

Ids are kept as the data set gives them (a row without one gets `FILE:ROW`, stable across reruns,
so resuming still works). A row without a question is reported (file, row, field) and skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stepgap.io import ErrorReport, _iter_rows, read_records, refuse_other_format
from stepgap.schema import to_plain

# The reader of the templates' last line (the reward and the data builders ask it).
_QUESTION = re.compile(r"Question:\s*(.+?)\s*(?:\n|<\|im_end\|>|$)", re.DOTALL)


def question_line(text: str) -> str | None:
    """The question of a `Question: ...` line (Search-R1's templates end the prompt with one),
    or None: a text without one has no question that can be told from the rest."""
    m = _QUESTION.search(text)
    return m.group(1).strip() if m else None


FIELDS = ("id", "question", "answers", "data_source")

# Where each field may sit, first found wins: together these read every layout above.
PATHS: dict[str, tuple[str, ...]] = {
    "id": ("id", "_id", "extra_info.index"),
    "question": ("question",),
    "answers": ("golden_answers", "reward_model.ground_truth", "answer", "answers"),
    "data_source": ("data_source",),
}


class QAItem(BaseModel):
    """One question to roll out: its id, text, golden answers, and the prompt a data set ships."""

    model_config = ConfigDict(extra="forbid")

    id: str
    question: str
    golden_answers: list[str] = Field(default_factory=list)
    data_source: str | None = None
    prompt: list[dict[str, str]] | None = None  # Search-R1 parquet: the exact chat prompt


def parse_columns(spec: str | dict[str, str] | None) -> dict[str, str]:
    """`id=qid,question=q,answers=ans.aliases` -> {field: dotted path}; unknown fields are errors."""
    if spec is None:
        return {}
    if isinstance(spec, dict):
        pairs = list(spec.items())
    else:
        pairs = []
        for part in spec.split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            if not sep or not value.strip():
                raise ValueError(f"--columns: expected FIELD=COLUMN, got {part!r}")
            pairs.append((key.strip(), value.strip()))
    out = {}
    for key, value in pairs:
        if key not in FIELDS:
            raise ValueError(f"--columns: unknown field {key!r} (fields: {', '.join(FIELDS)})")
        out[key] = value
    return out


def _get(row: dict[str, Any], path: str) -> Any:
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _first(row: dict[str, Any], paths: tuple[str, ...]) -> tuple[str | None, Any]:
    for path in paths:
        value = _get(row, path)
        if value is not None:
            return path, value
    return None, None


def _answers(value: Any) -> list[str] | None:
    if value is None:
        return []
    value = to_plain(value)  # numpy arrays from parquet
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return [str(value)]
    if isinstance(value, list | tuple) and all(isinstance(a, str | int | float) for a in value):
        return [str(a) for a in value]
    return None


def _prompt_messages(value: Any) -> list[dict[str, str]] | None:
    value = to_plain(value)
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        if all(isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value):
            return [{"role": m["role"], "content": m["content"]} for m in value]
    return None


def qa_item(row: dict[str, Any], columns: dict[str, str], fallback_id: str) -> QAItem:
    """One row as a `QAItem`; raises `ValueError("field: reason")` when it cannot be read."""
    prompt = _prompt_messages(row.get("prompt"))
    paths = {f: (columns[f],) if f in columns else PATHS[f] for f in FIELDS}
    question = _first(row, paths["question"])[1]
    if question is None and prompt is not None and "question" not in columns:
        # A Search-R1 parquet without the FlashRAG columns: the question ends the prompt.
        question = question_line(prompt[-1]["content"])
    if not isinstance(question, str) or not question.strip():
        where = columns.get("question", "question")
        raise ValueError(f"{where}: no question (a non-empty string) in this row")
    answer_path, raw_answers = _first(row, paths["answers"])
    if isinstance(raw_answers, dict) and "target" in raw_answers:
        raw_answers = raw_answers["target"]  # `reward_model.ground_truth` given as the column
    answers = _answers(raw_answers)
    if answers is None:
        raise ValueError(f"{answer_path}: answers must be a string or a list of strings")
    if "answer_aliases" in row and not columns:  # MuSiQue
        answers += [a for a in (_answers(row["answer_aliases"]) or []) if a not in answers]
    id_path, qid = _first(row, paths["id"])
    if qid is None:
        qid = fallback_id
    elif id_path == "extra_info.index" and isinstance(_get(row, "extra_info.split"), str):
        qid = f"{_get(row, 'extra_info.split')}-{qid}"  # as `stepgap segment` names them
    source = _first(row, paths["data_source"])[1]
    return QAItem(
        id=str(qid),
        question=question.strip(),
        golden_answers=answers,
        data_source=source if isinstance(source, str) else None,
        prompt=prompt,
    )


def _iter_hub(name: str, split: str | None, subset: str | None) -> Iterator[tuple[int, dict]]:
    try:
        from datasets import get_dataset_split_names, load_dataset
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            f"{name}: reading a hub data set needs `pip install stepgap[train]`"
        ) from exc
    if split is None:
        # As Search-R1's qa_search_test_merge.py: test, else dev, else train.
        names = get_dataset_split_names(name, subset)
        split = next((s for s in ("test", "dev", "validation", "train") if s in names), names[0])
    ds = load_dataset(name, subset, split=split)
    yield from _iter_rows(iter(ds), len(ds), name)


def iter_questions(
    source: str | Path,
    *,
    columns: str | dict[str, str] | None = None,
    split: str | None = None,
    subset: str | None = None,
    report: ErrorReport | None = None,
) -> Iterator[QAItem]:
    """Questions from a JSONL / JSON / Parquet file, a `datasets` folder, or a hub data set id.

    `columns` maps fields (`id`, `question`, `answers`, `data_source`) to dotted column paths.
    `split` and `subset` apply to a hub id (default split: test, else dev/validation, else
    train). Rows that cannot be read go to `report` and are skipped.
    """
    report = report if report is not None else ErrorReport()
    mapping = parse_columns(columns)
    path = Path(source)
    if path.exists():
        rows = read_records(path, report)
    elif re.fullmatch(r"[\w.-]+(/[\w.-]+)?", str(source)):
        rows = _iter_hub(str(source), split, subset)
    else:
        raise FileNotFoundError(f"QA set not found: {source} (and it is not a hub data set id)")
    seen: set[str] = set()
    for n, (line, row) in enumerate(rows):
        if n == 0:  # a traces file is a QA set too (FlashRAG's columns); our other files not
            refuse_other_format(source, row, "a QA set", lambda found: found.name == "traces")
        try:
            item = qa_item(row, mapping, fallback_id=f"{path.name}:{line}")
        except ValueError as exc:
            field, _, reason = str(exc).partition(": ")
            report.add(source, line, reason, field=field)
            continue
        if item.id in seen:
            report.add(source, line, f"duplicate id {item.id!r}; the first row is kept", field="id")
            continue
        seen.add(item.id)
        yield item
