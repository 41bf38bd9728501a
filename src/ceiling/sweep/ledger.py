"""The sweep ledger: a durable SQLite record of every variant and every bench repeat.

Why SQLite: a sweep of 36-minute launches must survive a crash, a Ctrl-C or a lost SSH session
without losing a single finished repeat. Every event is its own committed transaction (WAL,
``synchronous=FULL``), so whatever was recorded before the process died is on disk, and
``--resume`` continues from exactly there. Rows are keyed by the variant's fingerprint: a
variant whose definition changed since the last run starts over instead of mixing results.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ceiling.errors import CeilingError
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


class Ledger:
    """One sweep's ledger file. Safe to reopen after any crash."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise CeilingError(
                f"cannot open sweep ledger {self.path}: {exc}",
                fix="pass another --out directory, or remove a corrupt ledger",
            ) from exc

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- meta ---------------------------------------------------------------------------
    def set_meta(self, key: str, value: Any) -> None:
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                (key, redact(json.dumps(value))),
            )

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    # ---- variants -----------------------------------------------------------------------
    def ensure_variant(self, fingerprint: str, name: str, variant_path: str) -> VariantRow:
        """Register a variant as pending unless the ledger already knows this fingerprint."""
        now = time.time()
        with self.db:
            self.db.execute(
                "INSERT OR IGNORE INTO variants(fingerprint, name, variant_path, status, updated)"
                " VALUES (?, ?, ?, 'pending', ?)",
                (fingerprint, name, variant_path, now),
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
        with self.db:
            self.db.execute(
                sql + " WHERE fingerprint = ?", (status, time.time(), *fields.values(), fingerprint)
            )

    def variant(self, fingerprint: str) -> VariantRow | None:
        cur = self.db.execute("SELECT * FROM variants WHERE fingerprint = ?", (fingerprint,))
        row = cur.fetchone()
        if row is None:
            return None
        return VariantRow(**dict(zip([c[0] for c in cur.description], row, strict=True)))

    def variants(self) -> list[VariantRow]:
        cur = self.db.execute("SELECT * FROM variants ORDER BY rowid")
        cols = [c[0] for c in cur.description]
        return [VariantRow(**dict(zip(cols, r, strict=True))) for r in cur.fetchall()]

    # ---- repeats ------------------------------------------------------------------------
    def record_repeat(
        self, fingerprint: str, idx: int, tok_s: float | None, result: dict[str, Any]
    ) -> None:
        """Commit one bench repeat (idempotent per (fingerprint, idx))."""
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO repeats(fingerprint, idx, tok_s, result_json, recorded)"
                " VALUES (?, ?, ?, ?, ?)",
                (fingerprint, idx, tok_s, redact(json.dumps(result, default=str)), time.time()),
            )

    def samples(self, fingerprint: str) -> list[float]:
        """Per-repeat tok/s, in repeat order (repeats without a rate are skipped)."""
        rows = self.db.execute(
            "SELECT tok_s FROM repeats WHERE fingerprint = ? AND tok_s IS NOT NULL ORDER BY idx",
            (fingerprint,),
        ).fetchall()
        return [float(r[0]) for r in rows]

    def repeat_count(self, fingerprint: str) -> int:
        return int(
            self.db.execute(
                "SELECT COUNT(*) FROM repeats WHERE fingerprint = ?", (fingerprint,)
            ).fetchone()[0]
        )

    def results(self, fingerprint: str) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT result_json FROM repeats WHERE fingerprint = ? ORDER BY idx", (fingerprint,)
        ).fetchall()
        return [json.loads(r[0]) for r in rows]
