"""Preflight's nouns: one variant's report and a run's reports (``doctor.json`` and sweep
results hold them; ``ceiling.flows.preflight`` fills them)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, computed_field

from ceiling.engines.flags import Problem

SCHEMA_VERSION = 1


class PreflightReport(BaseModel):
    """The verdict on one variant: ``ok`` is False when any problem is an error."""

    schema_version: int = SCHEMA_VERSION
    variant: str
    engine: str
    engine_version: str | None = None
    flag_source: str | None = None
    flags_cache: str | None = None
    cache_hit: bool = False
    flags_checked: int = 0
    env_checked: int = 0
    problems: list[Problem] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    environment: dict[str, Any] | None = None  # `ceiling env`'s report of the engine's Python
    elapsed_s: float = 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        return not any(p.level == "error" for p in self.problems)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.level == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.level == "warning"]

    def summary(self) -> dict[str, Any]:
        """The report as JSON data (``ok`` included)."""
        return self.model_dump(mode="json")


class PreflightRun(BaseModel):
    """``ceiling preflight``: every variant's report."""

    schema_version: int = SCHEMA_VERSION
    reports: list[PreflightReport] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.reports)
