"""Check a variant against the INSTALLED engine before anything loads.

The founding story lost a 36-minute load to ``--num-scheduler-steps``, a flag the installed vLLM
no longer had. preflight asks the engine itself which flags it accepts (its own argument parser,
dumped once per engine version and cached), then checks every flag, value and environment
variable of the variant (``flagcheck.py``), says *why* a flag is unknown when we know
(removed/renamed-flag table), and suggests the closest valid flag. No model is loaded and no GPU
is touched; with the cache warm a whole sweep plan is checked in well under a second per variant.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, computed_field

from ceiling.engines import get_engine
from ceiling.engines.flagcheck import check_args, check_env
from ceiling.engines.flags import Problem
from ceiling.engines.variant import Variant, load_variant
from ceiling.envcheck.check import check_for_preflight

__all__ = [
    "PreflightReport",
    "PreflightRun",
    "Problem",
    "check_args",
    "check_env",
    "preflight",
    "preflight_files",
    "preflight_many",
]

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


def preflight(variant: Variant, refresh: bool = False, env_check: bool = True) -> PreflightReport:
    """Check ``variant``'s model path, flags and environment against the installed engine, and
    (``env_check``) the engine's Python environment and this host (``ceiling env``)."""
    t0 = time.monotonic()
    engine = get_engine(variant.engine)
    report = PreflightReport(variant=variant.name, engine=engine.name)
    model_path = variant.model_path()
    if model_path is not None and not model_path.exists():
        report.problems.append(
            Problem(
                level="error",
                kind="model_missing",
                subject=str(model_path),
                message=f"model path not found: {model_path}",
                fix="fix `model:` in the variant",
            )
        )
    install = engine.locate(variant)
    report.notes.extend(install.notes)
    table = engine.flag_table(install, refresh=refresh)
    report.engine_version = table.version
    report.flag_source = table.source
    report.flags_cache = table.cache_path
    report.cache_hit = table.cache_hit
    report.problems.extend(check_args(variant.args, table, engine))
    report.flags_checked = len(variant.args)
    report.problems.extend(check_env(variant.env, table, engine))
    report.env_checked = len(variant.env)
    if env_check and install.python is not None:  # `ceiling env` of the engine's Python
        tp = engine.tensor_parallel(variant)
        report.environment, found = check_for_preflight(str(install.python), tp, variant.env)
        report.problems.extend(Problem.model_validate(f) for f in found)
    report.elapsed_s = round(time.monotonic() - t0, 3)
    return report


def preflight_many(variants: list[Variant], refresh: bool = False) -> list[PreflightReport]:
    """Check every variant of a plan before the first launch (flag tables are shared/cached)."""
    return [preflight(v, refresh=refresh) for v in variants]


def preflight_files(
    paths: list[Path],
    refresh: bool = False,
    on_variant: Callable[[Variant], None] | None = None,
) -> PreflightRun:
    """``ceiling preflight``: load every variant file first (a broken one fails before any
    engine is asked), then check each; ``on_variant`` hears which one is being checked."""
    variants = [load_variant(p) for p in paths]
    run = PreflightRun()
    for variant in variants:
        if on_variant is not None:
            on_variant(variant)
        run.reports.append(preflight(variant, refresh=refresh))
    return run
