"""The sanity gate's nouns (``SanityReport`` and its checks and probes), apart from the HTTP
checks that fill them (``checks.py``), so that a pure reader (``ceiling.diagnose``) can hold
one without importing any I/O."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, Field

Status = Literal["ok", "suspect", "broken", "skipped"]
Verdict = Literal["ok", "suspect", "broken"]
SCHEMA_VERSION = 1


class Probe(BaseModel):
    """One greedy completion and what was expected of it."""

    id: str
    prompt: str
    expect: str | None = None
    text: str = ""
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    completion_tokens: int | None = None
    max_tokens: int = 0
    forced_length: bool = False  # asked with end-of-sequence ignored (and the server took it)
    passed: bool | None = None
    seconds: float = 0.0


class Check(BaseModel):
    """One question the gate asked, its answer and the evidence."""

    name: str
    status: Status
    summary: str
    value: float | None = None
    evidence: list[str] = Field(default_factory=list)


class SanityReport(BaseModel):
    """The sanity gate's result (``ceiling sanity --json``; ``sanity`` in doctor.json)."""

    schema_version: int = SCHEMA_VERSION
    kind: str = "sanity"
    created: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    url: str
    model: str
    engine: str | None = None
    model_dir: str | None = None
    dtype: str | None = None
    family: str
    family_reason: str
    verdict: Verdict
    headline: str
    checks: list[Check]
    probes: list[Probe] = Field(default_factory=list)
    perplexity: float | None = None
    seconds: float = 0.0

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)
