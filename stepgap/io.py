"""Reading and writing record files, where one bad record never loses the others.

Readers yield `(line, record)` pairs and put every unreadable or invalid record into an
`ErrorReport` (file, line, field, reason) instead of raising. Writers append one JSON line at a
time and flush, so a crash loses at most the line being written.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from pydantic import BaseModel, ValidationError
from tqdm.auto import tqdm

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

PARQUET_SUFFIXES = {".parquet", ".pq"}


@dataclass(frozen=True)
class RecordError:
    """Why one record was skipped; `line` is 1-based (row number for Parquet and JSON arrays)."""

    file: str
    line: int
    field: str | None
    reason: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        return f"{where}: {self.field}: {self.reason}" if self.field else f"{where}: {self.reason}"


@dataclass
class ErrorReport:
    """Collects skipped records across files; shown to the user at the end of a command."""

    errors: list[RecordError] = field(default_factory=list)

    def add(self, file: str | Path, line: int, reason: str, field: str | None = None) -> None:
        err = RecordError(str(file), line, field, reason)
        self.errors.append(err)
        log.warning("skipped %s", err)

    def add_validation(self, file: str | Path, line: int, exc: ValidationError) -> None:
        """One entry per pydantic error, each naming the dotted field path."""
        for item in exc.errors():
            loc = ".".join(str(p) for p in item["loc"]) or None
            self.add(file, line, item["msg"], field=loc)

    def __len__(self) -> int:
        return len(self.errors)

    def __bool__(self) -> bool:
        return bool(self.errors)

    def summary(self, limit: int = 20) -> str:
        lines = [str(e) for e in self.errors[:limit]]
        if len(self.errors) > limit:
            lines.append(f"... and {len(self.errors) - limit} more")
        return "\n".join(lines)

    def write(self, path: str | Path) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            for e in self.errors:
                fh.write(json.dumps(e.__dict__, ensure_ascii=False) + "\n")


def _progress(total: int | None, desc: str, unit: str = "B") -> tqdm:
    # disable=None turns the bar off when stderr is not a terminal (CI logs stay readable).
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, disable=None, leave=False)


def key_lines(text: str) -> dict[str, int]:
    """Top-level key -> 1-based line of a YAML or JSON mapping, for error messages that name
    the line of a configuration file's key."""
    import yaml

    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {k.value: k.start_mark.line + 1 for k, _ in node.value if hasattr(k, "value")}


def _iter_jsonl(path: Path, report: ErrorReport) -> Iterator[tuple[int, dict[str, Any]]]:
    with open(path, "rb") as fh, _progress(path.stat().st_size, path.name) as bar:
        for lineno, raw in enumerate(fh, start=1):
            bar.update(len(raw))
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                report.add(path, lineno, f"not valid UTF-8 ({exc.reason} at byte {exc.start})")
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                report.add(path, lineno, f"invalid JSON: {exc.msg} (column {exc.colno})")
                continue
            if not isinstance(obj, dict):
                report.add(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
                continue
            yield lineno, obj


def _iter_json_array(path: Path, report: ErrorReport) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        report.add(path, 1, f"not a readable JSON array: {exc}")
        return
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        report.add(path, 1, f"expected a JSON array of objects, got {type(data).__name__}")
        return
    for i, obj in enumerate(data, start=1):
        if isinstance(obj, dict):
            yield i, obj
        else:
            report.add(path, i, f"expected a JSON object, got {type(obj).__name__}")


def _iter_rows(rows: Iterable[dict[str, Any]], total: int, name: str) -> Iterator[tuple[int, dict]]:
    with _progress(total, name, unit="rec") as bar:
        for i, row in enumerate(rows, start=1):
            bar.update(1)
            yield i, row


def _iter_parquet(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)

    def rows() -> Iterator[dict[str, Any]]:
        for batch in pf.iter_batches(batch_size=1024):
            yield from batch.to_pylist()

    yield from _iter_rows(rows(), pf.metadata.num_rows, path.name)


def _iter_hf_dataset(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        from datasets import Dataset, DatasetDict, load_from_disk
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            f"{path} is a `datasets` folder; reading it needs `pip install stepgap[train]`"
        ) from exc
    ds = load_from_disk(str(path))
    if isinstance(ds, DatasetDict):
        splits: list[Dataset] = list(ds.values())
    else:
        splits = [ds]
    for split in splits:
        yield from _iter_rows(iter(split), len(split), path.name)


def read_records(
    path: str | Path, report: ErrorReport | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line, object)` from JSONL, a JSON array, Parquet or a `datasets` folder.

    The format follows the suffix (`.json` is tried as an array first, then as JSON Lines).
    Records that cannot be read go to `report` and are skipped.
    """
    path = Path(path)
    report = report if report is not None else ErrorReport()
    if not path.exists():
        raise FileNotFoundError(f"input file not found: {path}")
    if path.is_dir():
        yield from _iter_hf_dataset(path)
    elif path.suffix.lower() in PARQUET_SUFFIXES:
        yield from _iter_parquet(path)
    elif path.suffix.lower() == ".json" and path.read_bytes()[:1].lstrip() in (b"[", b""):
        yield from _iter_json_array(path, report)
    else:
        yield from _iter_jsonl(path, report)


def read_models(
    path: str | Path, model: type[M], report: ErrorReport | None = None
) -> Iterator[tuple[int, M]]:
    """Like `read_records`, validated into `model`; invalid records are reported per field."""
    report = report if report is not None else ErrorReport()
    for lineno, obj in read_records(path, report):
        try:
            yield lineno, model.model_validate(obj)
        except ValidationError as exc:
            report.add_validation(path, lineno, exc)


def read_steps_once(path: str | Path, model: type[M], report: ErrorReport, again: str) -> list[M]:
    """The records of a per-step file (`trace_id`, `step`); a step given twice is an input error:
    the later line is reported (`again`, formatted with the first line's number) and skipped."""
    first: dict[tuple[str, int], int] = {}
    kept = []
    for line, rec in read_models(path, model, report):
        key = (rec.trace_id, rec.step)  # type: ignore[attr-defined]
        if key in first:
            report.add(
                path,
                line,
                f"trace {key[0]!r} step {key[1]} {again.format(line=first[key])}; "
                "this line is skipped",
                field="step",
            )
            continue
        first[key] = line
        kept.append(rec)
    return kept


def dump_record(record: BaseModel | dict[str, Any]) -> str:
    """One JSON line (no trailing newline); models drop nothing, so extra keys survive."""
    if isinstance(record, BaseModel):
        return record.model_dump_json()
    return json.dumps(record, ensure_ascii=False)


def check_output(output: str | Path, *inputs: str | Path) -> Path:
    """`output` as a path to write, or a ValueError saying why not: it is a folder, or it is one
    of the `inputs` (writing it would destroy what is being read)."""
    path = Path(output)
    if path.is_dir():
        raise ValueError(f"{output}: is a folder; -o takes a file path")
    for given in inputs:
        source = Path(given)
        same = (
            path.samefile(source)
            if path.exists() and source.exists()
            else path.resolve() == source.resolve()
        )
        if same:
            raise ValueError(f"{output}: is also an input ({given}); write to another file")
    return path


class JsonlWriter:
    """Writes JSON lines, flushing each one.

    `append=True` (resumable jobs) appends to the file itself, so finished work survives a
    crash. Otherwise the lines go to a temporary file beside it that replaces the file only when
    the writer closes without an error: a run that fails or is interrupted leaves the old file as
    it was, never an empty or half-written one."""

    def __init__(self, path: str | Path, *, append: bool = False, fsync: bool = False) -> None:
        self.path = check_output(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync
        if append:
            _truncate_partial_last_line(self.path)
            self._target = self.path
        else:
            self._target = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        self._fh: IO[str] = open(self._target, "a" if append else "w", encoding="utf-8")

    def write(self, record: BaseModel | dict[str, Any]) -> None:
        self._fh.write(dump_record(record) + "\n")
        self._fh.flush()
        if self._fsync:
            os.fsync(self._fh.fileno())

    def close(self, *, failed: bool = False) -> None:
        """Close; a whole (not `failed`) temporary file takes the file's place."""
        if self._fh.closed:
            return
        self._fh.close()
        if self._target == self.path:
            return
        if failed:
            self._target.unlink(missing_ok=True)
        else:
            os.replace(self._target, self.path)

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(failed=exc_type is not None)


def _truncate_partial_last_line(path: Path) -> None:
    """Drop a half-written last line left by a killed process before appending after it."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - 1))
        if fh.read(1) == b"\n":
            return
        # Walk back to the previous newline; everything after it is a partial record.
        pos = size - 1
        chunk = 4096
        while pos > 0:
            start = max(0, pos - chunk)
            fh.seek(start)
            buf = fh.read(pos - start)
            idx = buf.rfind(b"\n")
            if idx >= 0:
                fh.truncate(start + idx + 1)
                log.warning("%s: dropped a partial last line left by an interrupted run", path)
                return
            pos = start
        fh.truncate(0)
