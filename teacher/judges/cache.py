"""A persistent judge cache: the same prompt to the same model is never paid for twice.

SQLite in WAL mode, one row per answered prompt, committed as soon as the answer arrives, so a
killed run keeps every answer it received and several processes (shards, relabels) can share one
file. Only schema-valid answers are stored; failures are retried by the next run. The key hashes
the backend, the model, the prompt version, the decoding parameters and the exact messages; no
credential is ever part of a key or a value.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from stepgap.schema import Judge
from stepgap.tree import JudgeResult

from .base import JudgeRequest

DEFAULT_CACHE_ENV = "STEPGAP_CACHE"


def default_cache_path() -> Path:
    """`$STEPGAP_CACHE`, else `~/.cache/stepgap/judge-cache.sqlite` (XDG_CACHE_HOME honoured)."""
    if os.environ.get(DEFAULT_CACHE_ENV):
        return Path(os.environ[DEFAULT_CACHE_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "stepgap" / "judge-cache.sqlite"


def cache_key(
    backend: str, model: str, prompt_version: str, params: dict[str, Any], request: JudgeRequest
) -> str:
    payload = json.dumps(
        {
            "backend": backend,
            "model": model,
            "prompt_version": prompt_version,
            "params": params,
            "messages": request.messages,
        },
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class _Connections(threading.local):
    """Each thread's own SQLite connection (a connection is not shared between threads)."""

    conn: sqlite3.Connection | None = None


class JudgeCache:
    """Key -> judge result, shared safely between threads and processes."""

    def __init__(self, path: str | Path, *, open_now: bool = True) -> None:
        """`open_now=False` touches no file until `open()` or the first lookup: a judge that
        fails to build (no API key, a model that does not load) leaves no cache behind."""
        self.path = Path(path)
        self._local = _Connections()
        if open_now:
            self.open()

    def open(self) -> JudgeCache:
        """Create the file and its table where they are missing (an unwritable path fails here,
        before any answer is paid for)."""
        self._conn()
        return self

    def _conn(self) -> sqlite3.Connection:
        conn = self._local.conn
        if conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
            conn.execute("PRAGMA busy_timeout=60000")
            _switch_to_wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS judge_cache ("
                " key TEXT PRIMARY KEY, model TEXT NOT NULL, value TEXT NOT NULL,"
                " created REAL NOT NULL DEFAULT (julianday('now')))"
            )
            self._local.conn = conn
        return conn

    def get(self, key: str, answer: type[BaseModel] | None = None) -> JudgeResult | None:
        """The stored result of `key`, validated as `answer` (default: the teacher's judge)."""
        row = self._conn().execute("SELECT value FROM judge_cache WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        value = json.loads(row[0])
        return JudgeResult(
            judge=(answer or Judge).model_validate(value["judge"]),
            confidences=value.get("confidences") or {},
            usage=value.get("usage") or {},
        )

    def put(self, key: str, model: str, result: JudgeResult) -> None:
        if result.judge is None:
            return
        value = {
            "judge": result.judge.model_dump(mode="json"),
            "confidences": result.confidences,
            "usage": result.usage,
        }
        self._conn().execute(
            "INSERT OR REPLACE INTO judge_cache (key, model, value) VALUES (?, ?, ?)",
            (key, model, json.dumps(value, ensure_ascii=False)),
        )

    def __len__(self) -> int:
        return self._conn().execute("SELECT COUNT(*) FROM judge_cache").fetchone()[0]


def _switch_to_wal(conn: sqlite3.Connection, patience: float = 60.0) -> None:
    """WAL mode (readers never block the writer), set once per file. Switching needs an
    exclusive lock and SQLite answers "database is locked" at once, without waiting out the busy
    timeout, when another process (a second `--shard`) is opening or switching the same new
    file: so retry for up to `patience` seconds."""
    deadline = time.monotonic() + patience
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
