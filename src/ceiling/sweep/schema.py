"""The sweep's result document (``sweep.json``): what each variant did, against the baseline.

Its own module so that the runner (which writes it) and the report (which renders it) name it
without importing each other. Read back strictly: a key it does not know is an error.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1


class VariantSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    fingerprint: str
    status: str
    repeats: int
    tok_s: float | None = None
    low: float | None = None
    high: float | None = None
    delta_pct: float | None = None
    delta_low_pct: float | None = None
    delta_high_pct: float | None = None
    verdict: str | None = None
    log_path: str | None = None
    stop_reason: str | None = None
    error: str | None = None


class ComparisonRow(BaseModel):
    """One row of the report's variant comparison (the baseline has no ``delta_pct``)."""

    model_config = ConfigDict(extra="forbid")

    label: str
    tok_s: float | None = None
    low: float | None = None
    high: float | None = None
    delta_pct: float | None = None
    verdict: str | None = None
    status: str | None = None
    repeats: int | None = None


class SweepVerdict(BaseModel):
    """The sweep's answer: does any variant beat the baseline, and the baseline's rate."""

    model_config = ConfigDict(extra="forbid")

    headline: str
    measured_tok_s: float | None = None
    measured_ci_low: float | None = None
    measured_ci_high: float | None = None
    notes: list[str] = Field(default_factory=list)


class SweepResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    kind: Literal["sweep"] = "sweep"
    title: str
    plan: str | None
    ledger: str
    baseline: str
    variants: list[VariantSummary]
    comparison: list[ComparisonRow]
    verdict: SweepVerdict
    reproduce: list[str] = Field(default_factory=list)
