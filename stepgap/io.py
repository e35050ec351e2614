"""Reading and writing record files, where one bad record never loses the others, and a failed
run never damages an earlier output.

Readers yield `(line, record)` pairs and put every unreadable or invalid record into an
`ErrorReport` (file, line, field, reason) instead of raising. Two things are errors instead: a
file that is another of our formats (traces where verdicts are expected: said once, not once per
line) and a file none of whose records can be read.

Every output is written the same way (`replacing`): into a temporary file or folder beside it,
which takes its place only when the run succeeds, so a failed or interrupted run leaves the old
output byte for byte; an output that is also an input is refused. Resumable jobs append instead
(`JsonlWriter(append=True)`), one flushed line at a time, so a crash loses at most that line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from pydantic import BaseModel, ValidationError
from tqdm.auto import tqdm

log = logging.getLogger(__name__)
# Each skipped record, as it is skipped; the command line prints the report once at the end
# instead (and silences this logger), a library caller sees them here.
skipped_log = logging.getLogger(__name__ + ".skipped")

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
        skipped_log.warning("skipped %s", err)

    def add_validation(self, file: str | Path, line: int, exc: ValidationError) -> None:
        """One entry per pydantic error, each naming the dotted field path, in plain words."""
        for item in exc.errors():
            loc = ".".join(str(p) for p in item["loc"]) or None
            self.add(file, line, plain_reason(item["msg"]), field=loc)

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
        with JsonlWriter(path) as out:
            for e in self.errors:
                out.write(e.__dict__)


# what pydantic puts before the message of a validator's own error
_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def plain_reason(message: str) -> str:
    """A validation message without pydantic's prefix ("Value error, ...")."""
    for prefix in _PYDANTIC_PREFIXES:
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message


@dataclass(frozen=True)
class FileFormat:
    """One of the record files stepgap reads and writes (docs/contract.md, section 1): its name,
    the keys every record of it has, and what makes it."""

    name: str
    keys: frozenset[str]
    made_by: str


# In the order a record is tried: a verdict also has a judge, a step and a label, so it is
# recognised before the judge replay and gold label files whose keys it holds.
FORMATS = (
    FileFormat("verdicts", frozenset({"trace_id", "step", "type", "label", "repair"}),
               "what stepgap check and label write"),
    FileFormat("rewards", frozenset({"trace_id", "variant", "lam", "em", "reward", "steps"}),
               "what stepgap reward writes"),
    FileFormat("judge replay answers", frozenset({"trace_id", "step", "judge"}),
               "stored judge answers"),
    FileFormat("gold step labels", frozenset({"trace_id", "step", "label"}), "hand labels"),
    FileFormat("gold trace labels", frozenset({"trace_id", "correct"}), "hand labels"),
    FileFormat("NLI replay answers", frozenset({"premise", "hypothesis", "probs"}),
               "stored NLI answers"),
    FileFormat("skipped-record", frozenset({"file", "line", "reason"}), "what --errors writes"),
    FileFormat("traces", frozenset({"id", "question"}), "raw or segmented responses"),
)  # fmt: skip


def sniff_format(keys: Iterable[str]) -> FileFormat | None:
    """The format whose keys a record (or a model's fields) has, if any."""
    have = set(keys)
    return next((f for f in FORMATS if f.keys <= have), None)


def _reads(model: type[BaseModel], fmt: FileFormat) -> bool:
    """Whether `model` reads records of `fmt`: its keys are fields of the model, and they
    include every field the model requires."""
    required = {name for name, f in model.model_fields.items() if f.is_required()}
    return fmt.keys <= set(model.model_fields) and required <= fmt.keys


def _expected_format(model: type[BaseModel]) -> FileFormat | None:
    """The format a model reads (the first that `_reads` accepts)."""
    return next((f for f in FORMATS if _reads(model, f)), None)


class WrongFormatError(ValueError):
    """A file that is another of our formats than the one expected: one error, not a skipped
    record per line."""


def refuse_other_format(
    path: str | Path, record: dict[str, Any], what: str, fits: Callable[[FileFormat], bool]
) -> None:
    """A `WrongFormatError` when `record` (a file's first) is of one of our formats that does
    not `fit` what the reader expects (`what`)."""
    found = sniff_format(record)
    if found is not None and not fits(found):
        raise WrongFormatError(
            f"{path} is a {found.name} file ({found.made_by}), not {what}: "
            "check which file goes where"
        )


class UnreadableFileError(ValueError):
    """A file none of whose records could be read: nothing to work on, so nothing is written."""


class EmptyInputError(UnreadableFileError):
    """A file with no records at all (empty, or blank lines only): an input error like an
    unreadable one, so a command given it writes nothing and an earlier output stays."""


class _Checked:
    """What `read_models` learns of one file as it reads: whether the first record is of
    another format, and whether any record was readable at all."""

    def __init__(self, path: Path, model: type[BaseModel], what: str | None) -> None:
        self.path, self.model = path, model
        expected = _expected_format(model)
        self.what = what or (expected.name if expected else model.__name__)
        self.first = True
        self.read = self.valid = 0

    def record(self, obj: dict[str, Any], valid: bool) -> None:
        """Count one record; raise on a first record that is invalid and of another format."""
        self.read += 1
        self.valid += valid
        first, self.first = self.first, False
        if valid or not first:
            return
        refuse_other_format(self.path, obj, self.what, self._fits)

    def _fits(self, found: FileFormat) -> bool:
        """Whether a record of `found` is what the model reads (a bad line of it, then)."""
        return found.name == self.what or _reads(self.model, found)

    def end(self, report: ErrorReport, errors_before: int) -> None:
        """Raise if records were read but none was valid."""
        if self.read and not self.valid:
            first = report.errors[errors_before] if len(report) > errors_before else None
            raise UnreadableFileError(
                f"{self.path}: none of its {self.read} record(s) is {self.what}"
                + (f"; the first: {first}" if first else "")
            )


def _progress(total: int | None, desc: str, unit: str = "B") -> tqdm:
    # disable=None turns the bar off when stderr is not a terminal (CI logs stay readable).
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, disable=None, leave=False)


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
            try:  # without its line end, a cut line reads "Unterminated string", not a control char
                obj = json.loads(text.rstrip("\r\n"))
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


def require_input(path: str | Path, role: str = "input file") -> Path:
    """`path` if it exists and is not an empty file, else the one-line error `read_records`
    gives (`FileNotFoundError`, `EmptyInputError`). A command that loads a model before reading
    its input asks this first, so a mistyped path or an empty file fails at once, not after
    minutes of loading."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{role} not found: {path}")
    if path.is_file() and path.stat().st_size == 0:
        raise EmptyInputError(f"{path}: has no records (an empty {role}): nothing to work on")
    return path


def read_records(
    path: str | Path, report: ErrorReport | None = None, *, role: str = "input file"
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line, object)` from JSONL, a JSON array, Parquet or a `datasets` folder.

    The format follows the suffix (`.json` is tried as an array first, then as JSON Lines).
    Records that cannot be read go to `report` and are skipped; a file with lines of which none
    could be read is an `UnreadableFileError`, and one with no records at all an
    `EmptyInputError` (raised once the caller has taken every record, so an output being
    written is discarded and an earlier one stays). `role` names the file in errors ("judge replay
    file").
    """
    path = require_input(path, role)
    report = report if report is not None else ErrorReport()
    before, read = len(report), 0
    for record in _records_of(path, report):
        read += 1
        yield record
    if read:
        return
    if len(report) > before:
        raise UnreadableFileError(
            f"{path}: none of its lines is a JSON record; the first: {report.errors[before]}"
        )
    raise EmptyInputError(f"{path}: has no records (an empty {role}): nothing to work on")


def _records_of(path: Path, report: ErrorReport) -> Iterator[tuple[int, dict[str, Any]]]:
    """The records of `path` by its format: a `datasets` folder, Parquet, a JSON array or
    JSON Lines."""
    if path.is_dir():
        return _iter_hf_dataset(path)
    if path.suffix.lower() in PARQUET_SUFFIXES:
        return _iter_parquet(path)
    if path.suffix.lower() == ".json" and path.read_bytes()[:1].lstrip() in (b"[", b""):
        return _iter_json_array(path, report)
    return _iter_jsonl(path, report)


def read_models(
    path: str | Path,
    model: type[M],
    report: ErrorReport | None = None,
    *,
    role: str = "input file",
    what: str | None = None,
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Iterator[tuple[int, M]]:
    """Like `read_records`, validated into `model` (after `prepare`, which maps other column
    names onto it); invalid records are reported per field.

    A first record that is invalid and of another of our formats is a `WrongFormatError`, and
    a file none of whose records is valid an `UnreadableFileError`: the file is the mistake,
    not its lines. `what` names what `model` reads in those errors (default: its format's name).
    """
    report = report if report is not None else ErrorReport()
    checked = _Checked(Path(path), model, what)
    before = len(report)
    for lineno, obj in read_records(path, report, role=role):
        try:
            rec = model.model_validate(prepare(obj) if prepare else obj)
        except ValidationError as exc:
            checked.record(obj, valid=False)
            report.add_validation(path, lineno, exc)
            continue
        checked.record(obj, valid=True)
        yield lineno, rec
    checked.end(report, before)


def read_steps_once(
    path: str | Path, model: type[M], report: ErrorReport, again: str, *, what: str | None = None
) -> list[M]:
    """The records of a per-step file (`trace_id`, `step`); a step given twice is an input error:
    the later line is reported (`again`, formatted with the first line's number) and skipped."""
    first: dict[tuple[str, int], int] = {}
    kept = []
    for line, rec in read_models(path, model, report, what=what):
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


def check_output(output: str | Path, *inputs: str | Path, folder: bool = False) -> Path:
    """`output` as a path to write, or a ValueError saying why not: it is a folder where a file
    is written (or the reverse), or it is one of the `inputs` (writing it would destroy what is
    being read)."""
    path = Path(output)
    if path.is_dir() and not folder:
        raise ValueError(f"{output}: is a folder; -o takes a file path")
    if path.is_file() and folder:
        raise ValueError(f"{output}: is a file; -o takes a folder here")
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


def _partial(path: Path) -> Path:
    """The temporary name beside `path` that a run writes to (hidden, one per process)."""
    return path.with_name(f".{path.name}.{os.getpid()}.partial")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _put_in_place(partial: Path, path: Path) -> None:
    """`partial` takes `path`'s place: one rename for a file; for a folder, the old one is moved
    aside, the new one renamed in, then the old one removed."""
    if not partial.is_dir() or not path.exists():
        os.replace(partial, path)
        return
    old = path.with_name(f".{path.name}.{os.getpid()}.old")
    _remove(old)
    os.replace(path, old)
    os.replace(partial, path)
    _remove(old)


@contextlib.contextmanager
def replacing(
    output: str | Path, *inputs: str | Path, folder: bool = False, owned_by: str | None = None
) -> Iterator[Path]:
    """The one way an output is written: yields a temporary path beside `output` to write (a
    fresh folder when `folder`), which takes `output`'s place when the block ends without an
    error; on an error or an interrupt it is removed and `output` is left as it was.

    The output must not be one of `inputs`. A folder is replaced whole, so an existing one must
    be empty or hold `owned_by` (the file that marks an earlier output of the same command):
    a folder of anything else is refused, never deleted."""
    path = check_output(output, *inputs, folder=folder)
    if folder and owned_by and path.is_dir() and any(path.iterdir()):
        if not (path / owned_by).exists():
            raise ValueError(
                f"{output}: is a folder with other files in it (no {owned_by}), and the output "
                "replaces the folder whole: choose a new folder"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = _partial(path)
    _remove(partial)
    if folder:
        partial.mkdir()
    try:
        yield partial
    except BaseException:
        _remove(partial)
        raise
    _put_in_place(partial, path)


def write_text(output: str | Path, text: str, *inputs: str | Path) -> Path:
    """Write a whole text file the `replacing` way."""
    with replacing(output, *inputs) as partial:
        partial.write_text(text, encoding="utf-8")
    return Path(output)


K = TypeVar("K")


def resume_keys(path: str | Path, what: str, key: Callable[[dict[str, Any]], K]) -> list[K]:
    """`key(record)` of every record already in the JSON-lines file `path` (none if it does not
    exist), for a run that appends to it (`JsonlWriter(append=True)`): a half-written last line,
    from a killed run, is skipped; any other line `key` cannot read is a ValueError naming the
    file and line (`what`: the record's name), so nothing is appended to a foreign file."""
    path = Path(path)
    if not path.exists():
        return []
    keys: list[K] = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                keys.append(key(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
                if line.endswith("\n"):
                    raise ValueError(
                        f"{path}:{n}: not a {what} line; refusing to append to this file"
                    ) from None
    return keys


def write_parquet(output: str | Path, records: Iterable[BaseModel], *inputs: str | Path) -> int:
    """Records as the rows of one Parquet file (nested fields as Arrow structs and lists),
    written whole in place of `output` (`replacing`); returns the rows written. The readers
    take it back (`read_records`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [r.model_dump(mode="json", exclude_none=False) for r in records]
    with replacing(output, *inputs) as target:
        pq.write_table(pa.Table.from_pylist(rows), target)
    return len(rows)


class JsonlWriter:
    """Writes JSON lines, flushing each one.

    `append=True` (resumable jobs) appends to the file itself, so finished work survives a
    crash. Otherwise the lines go to a temporary file beside it that replaces the file only when
    the writer closes without an error (`replacing`): a run that fails or is interrupted leaves
    the old file as it was, never an empty or half-written one. `inputs` are refused as the
    output."""

    def __init__(
        self,
        path: str | Path,
        *inputs: str | Path,
        append: bool = False,
        fsync: bool = False,
    ) -> None:
        if Path(path).suffix.lower() in PARQUET_SUFFIXES:
            raise ValueError(
                f"{path}: a Parquet name, but this command writes JSON Lines: name it .jsonl "
                "(`stepgap segment` writes Parquet)"
            )
        self._fsync = fsync
        self._replacing: contextlib.AbstractContextManager[Path] | None = None
        if append:
            self.path = check_output(path, *inputs)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _truncate_partial_last_line(self.path)
            target = self.path
        else:
            self._replacing = replacing(path, *inputs)
            target = self._replacing.__enter__()
            self.path = Path(path)
        self._fh: IO[str] = open(target, "a" if append else "w", encoding="utf-8")

    def write(self, record: BaseModel | dict[str, Any]) -> None:
        self._fh.write(dump_record(record) + "\n")
        self._fh.flush()
        if self._fsync:
            os.fsync(self._fh.fileno())

    def close(self, *, failed: bool = False) -> None:
        """Close; unless `failed`, what was written takes the file's place."""
        if self._fh.closed:
            return
        self._fh.close()
        if self._replacing is None:
            return
        if failed:
            self._replacing.__exit__(RuntimeError, RuntimeError("discarded"), None)
        else:
            self._replacing.__exit__(None, None, None)

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
