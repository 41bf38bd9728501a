"""The sweep ledger: a durable SQLite record of every variant and every bench repeat.

Why SQLite: a sweep of 36-minute launches must survive a crash, a Ctrl-C or a lost SSH session
without losing a single finished repeat. Every event is its own committed transaction (WAL,
``synchronous=FULL``), so whatever was recorded before the process died is on disk, and
``--resume`` continues from exactly there. Rows are keyed by the variant's fingerprint: a
variant whose definition changed since the last run starts over instead of mixing results.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ceiling.errors import CeilingError, ExitStatus
from ceiling.redact import redact

STATUSES = ("pending", "running", "done", "stopped_early", "failed", "broken", "interrupted")
# broken: the sanity gate found the variant's output wrong; it was not benchmarked
FINISHED = ("done", "stopped_early", "failed", "broken")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS variants (
    fingerprint TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    variant_path TEXT,
    status TEXT NOT NULL,
    log_path TEXT,
    error TEXT,
    stop_reason TEXT,
    started REAL,
    finished REAL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS repeats (
    fingerprint TEXT NOT NULL,
    idx INTEGER NOT NULL,
    tok_s REAL,
    result_json TEXT NOT NULL,
    recorded REAL NOT NULL,
    PRIMARY KEY (fingerprint, idx)
);
"""


class VariantRow(BaseModel):
    fingerprint: str
    name: str
    variant_path: str | None = None
    status: str
    log_path: str | None = None
    error: str | None = None
    stop_reason: str | None = None
    started: float | None = None
    finished: float | None = None
    updated: float


#: SQLite's error (``sqlite3.Error.sqlite_errorname``, its primary code) -> the fix.
_FIXES = {
    "SQLITE_BUSY": "another sweep is writing this ledger: wait for it to end, or pass another --out",
    "SQLITE_LOCKED": "another sweep is writing this ledger: wait for it to end, or pass another --out",
    "SQLITE_FULL": "free some disk space, then run the sweep again with --resume: every repeat "
    "recorded so far is kept",
    "SQLITE_IOERR": "check the disk (dmesg), then run the sweep again with --resume",
    "SQLITE_NOTADB": "this file is not a sweep ledger: move it aside, or pass another --out",
    "SQLITE_CORRUPT": "the ledger is damaged: move it aside (a new sweep starts over), or pass "
    "another --out",
    "SQLITE_READONLY": "pass a writable --out",
    "SQLITE_CANTOPEN": "pass a writable --out",
    "SQLITE_PERM": "pass a writable --out",
}


def _ledger_error(
    path: Path, exc: sqlite3.Error, doing: str, status: ExitStatus = ExitStatus.FAILED
) -> CeilingError:
    """A SQLite failure as one line naming the ledger, what failed and the fix."""
    code = (getattr(exc, "sqlite_errorname", None) or "").split("_")
    primary = "_".join(code[:2])
    fix = _FIXES.get(primary, "pass another --out, or run the sweep again with --resume")
    return CeilingError(f"sweep ledger {path}: cannot {doing}: {exc}", fix=fix, exit_code=status)


@contextlib.contextmanager
def _sqlite(path: Path, doing: str, status: ExitStatus = ExitStatus.FAILED) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise _ledger_error(path, exc, doing, status) from None


class Ledger:
    """One sweep's ledger file. Safe to reopen after any crash. Every SQLite failure (a full
    disk, a ledger another sweep holds locked, a file that is not a database) is one
    CeilingError naming the ledger and the fix, never a traceback."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _sqlite(self.path, "open it", ExitStatus.INPUT):
            self.db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(_SCHEMA)

    def _write(self, sql: str, params: tuple[Any, ...]) -> None:
        """One committed statement."""
        with _sqlite(self.path, "record to it"), self.db:
            self.db.execute(sql, params)

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Every row of a query, as column -> value."""
        with _sqlite(self.path, "read it"):
            cur = self.db.execute(sql, params)
            cols = [c[0] for c in cur.description]
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- meta ---------------------------------------------------------------------------
    def set_meta(self, key: str, value: Any) -> None:
        self._write(
            "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
            (key, redact(json.dumps(value))),
        )

    def get_meta(self, key: str, default: Any = None) -> Any:
        rows = self._read("SELECT value FROM meta WHERE key = ?", (key,))
        return json.loads(rows[0]["value"]) if rows else default

    # ---- variants -----------------------------------------------------------------------
    def ensure_variant(self, fingerprint: str, name: str, variant_path: str) -> VariantRow:
        """Register a variant as pending unless the ledger already knows this fingerprint."""
        self._write(
            "INSERT OR IGNORE INTO variants(fingerprint, name, variant_path, status, updated)"
            " VALUES (?, ?, ?, 'pending', ?)",
            (fingerprint, name, variant_path, time.time()),
        )
        row = self.variant(fingerprint)
        assert row is not None
        return row

    def set_status(self, fingerprint: str, status: str, **fields: Any) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown status {status}")
        allowed = {"log_path", "error", "stop_reason", "started", "finished"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"unknown fields {bad}")
        cols = ", ".join(f"{k} = ?" for k in fields)
        sql = "UPDATE variants SET status = ?, updated = ?" + (f", {cols}" if cols else "")
        self._write(
            sql + " WHERE fingerprint = ?", (status, time.time(), *fields.values(), fingerprint)
        )

    def variant(self, fingerprint: str) -> VariantRow | None:
        rows = self._read("SELECT * FROM variants WHERE fingerprint = ?", (fingerprint,))
        return VariantRow(**rows[0]) if rows else None

    def variants(self) -> list[VariantRow]:
        return [VariantRow(**r) for r in self._read("SELECT * FROM variants ORDER BY rowid")]

    # ---- repeats ------------------------------------------------------------------------
    def record_repeat(
        self, fingerprint: str, idx: int, tok_s: float | None, result: dict[str, Any]
    ) -> None:
        """Commit one bench repeat (idempotent per (fingerprint, idx))."""
        self._write(
            "INSERT OR REPLACE INTO repeats(fingerprint, idx, tok_s, result_json, recorded)"
            " VALUES (?, ?, ?, ?, ?)",
            (fingerprint, idx, tok_s, redact(json.dumps(result, default=str)), time.time()),
        )

    def samples(self, fingerprint: str) -> list[float]:
        """Per-repeat tok/s, in repeat order (repeats without a rate are skipped)."""
        rows = self._read(
            "SELECT tok_s FROM repeats WHERE fingerprint = ? AND tok_s IS NOT NULL ORDER BY idx",
            (fingerprint,),
        )
        return [float(r["tok_s"]) for r in rows]

    def repeat_count(self, fingerprint: str) -> int:
        rows = self._read("SELECT COUNT(*) AS n FROM repeats WHERE fingerprint = ?", (fingerprint,))
        return int(rows[0]["n"])

    def results(self, fingerprint: str) -> list[dict[str, Any]]:
        rows = self._read(
            "SELECT result_json FROM repeats WHERE fingerprint = ? ORDER BY idx", (fingerprint,)
        )
        return [json.loads(r["result_json"]) for r in rows]
