"""Search-R1 parquet made ready for the stepgap reward in veRL: `extra_info.question` added.

veRL gives a custom reward function the response, the ground truth and the row's `extra_info`,
never the prompt. Search-R1's data scripts (`scripts/data_process/nq_search.py`,
`qa_search_train_merge.py` in PeterGriffinJin/Search-R1) write `extra_info = {split, index}` and
keep the question inside the prompt (the user turn ends `Question: {question}\\n`), so the
reward cannot see it. `add_questions` copies such a file row for row, every column as it is,
with the question added to `extra_info`: the row's own `extra_info.question` if it has one, else
its `question` column (the FlashRAG column those scripts keep), else the user turn's `Question:`
line, read as the reward reads it (`rollout_formats.question_line`). A row with none is
reported (file, row, field) and left out, so training never meets it. The output is written to
a temporary file beside it and renamed when complete: a failed run leaves no half file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from stepgap.io import ErrorReport, UnreadableFileError, _progress, check_output, replacing

from .qa import question_line

QUESTION = pa.field("question", pa.string())


def _with_question(schema: pa.Schema, source: Path) -> pa.Schema:
    """The input's schema with `extra_info.question` (a string), everything else unchanged."""
    if "extra_info" not in schema.names:
        return _hf_features(schema.append(pa.field("extra_info", pa.struct([QUESTION]))))
    i = schema.get_field_index("extra_info")
    extra = schema.field(i)
    if not pa.types.is_struct(extra.type):
        raise ValueError(f"{source}: extra_info: expected a struct column, got {extra.type}")
    fields = [f for f in extra.type if f.name != "question"]
    at = extra.type.get_field_index("question")
    fields.insert(at if at >= 0 else len(fields), QUESTION)
    return _hf_features(schema.set(i, extra.with_type(pa.struct(fields))))


def _hf_features(schema: pa.Schema) -> pa.Schema:
    """Keep the `datasets` features that `to_parquet` stored in the schema in step with the new
    column (veRL reads the file with `datasets.load_dataset("parquet")`); features in a form
    not known here are dropped, and `datasets` then reads them from the Arrow types."""
    meta = dict(schema.metadata or {})
    if b"huggingface" not in meta:
        return schema
    try:
        info = json.loads(meta[b"huggingface"])
        features = info["info"]["features"]
        extra = features.setdefault("extra_info", {})
        if not isinstance(extra, dict) or "_type" in extra:  # not a plain struct of features
            raise TypeError(f"extra_info feature {extra!r}")
        extra["question"] = {"dtype": "string", "_type": "Value"}
        meta[b"huggingface"] = json.dumps(info).encode()
    except (ValueError, KeyError, TypeError):
        del meta[b"huggingface"]
    return schema.with_metadata(meta)


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def row_question(row: dict[str, Any]) -> str:
    """The question of one row; raises `ValueError("field: reason")` when it has none."""
    found = _text((row.get("extra_info") or {}).get("question")) or _text(row.get("question"))
    if found:
        return found
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        content: Any = prompt
    elif isinstance(prompt, list) and prompt:
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if not users:
            raise ValueError("prompt: no user turn (and no question column)")
        content = users[-1].get("content")
    else:
        raise ValueError("prompt: neither chat messages nor text (and no question column)")
    found = question_line(content) if isinstance(content, str) else None
    if not found:
        raise ValueError("prompt: no `Question:` line in the user turn (and no question column)")
    return found


def add_questions(
    source: str | Path,
    output: str | Path,
    report: ErrorReport | None = None,
    *,
    batch_size: int = 8192,
) -> int:
    """Copy the parquet `source` to `output` with `extra_info.question` on every row; returns the
    rows written. Rows without a question go to `report` and are left out; when no row has one,
    nothing is written and an existing `output` is left as it was."""
    source, output = Path(source), Path(output)
    report = report if report is not None else ErrorReport()
    if not source.is_file():
        raise FileNotFoundError(f"input file not found: {source}")
    check_output(output, source)
    try:
        data = pq.ParquetFile(source)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"{source}: not a readable Parquet file ({exc})") from exc
    schema = _with_question(data.schema_arrow, source)
    written = row = 0
    before = len(report)
    with replacing(output, source) as tmp:
        with (
            pq.ParquetWriter(tmp, schema) as writer,
            _progress(data.metadata.num_rows, source.name, unit="row") as bar,
        ):
            for batch in data.iter_batches(batch_size=batch_size):
                kept = []
                for record in batch.to_pylist():
                    row += 1
                    try:
                        question = row_question(record)
                    except ValueError as exc:
                        field, _, reason = str(exc).partition(": ")
                        report.add(source, row, reason, field=field)
                        continue
                    extra = record.get("extra_info") or {}
                    record["extra_info"] = {**extra, "question": question}
                    kept.append(record)
                if kept:
                    writer.write_batch(pa.RecordBatch.from_pylist(kept, schema=schema))
                written += len(kept)
                bar.update(batch.num_rows)
        if len(report) > before and not written:
            raise UnreadableFileError(
                f"{source}: no row has a question; the first: {report.errors[before]}"
            )
    return written
