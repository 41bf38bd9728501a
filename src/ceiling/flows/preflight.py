"""``ceiling preflight`` (and the preflight stage of launch, doctor and sweep): check a variant
against the INSTALLED engine, then the engine's Python environment and this host.

The first part is engine knowledge (``ceiling.engines.preflight.check_variant``: flags, values,
environment variables); the second is ``ceiling env`` (``ceiling.envcheck``) run for the
engine's interpreter. This flow puts the two together, so neither library imports the other.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ceiling.engines import get_engine
from ceiling.engines.flags import Problem
from ceiling.engines.preflight import check_variant
from ceiling.engines.preflight_model import PreflightReport, PreflightRun
from ceiling.engines.variant import Variant, load_variant
from ceiling.envcheck.check import check_for_preflight

__all__ = ["PreflightReport", "PreflightRun", "run", "run_files"]


def run(variant: Variant, refresh: bool = False, env_check: bool = True) -> PreflightReport:
    """Check ``variant``'s model path, flags and environment against the installed engine, and
    (``env_check``) the engine's Python environment and this host (``ceiling env``)."""
    t0 = time.monotonic()
    engine = get_engine(variant.engine)
    install = engine.locate(variant)
    report = check_variant(variant, refresh=refresh, install=install)
    if env_check and install.python is not None:  # `ceiling env` of the engine's Python
        tp = engine.tensor_parallel(variant)
        report.environment, found = check_for_preflight(str(install.python), tp, variant.env)
        report.problems.extend(Problem.model_validate(f) for f in found)
        report.elapsed_s = round(report.elapsed_s + time.monotonic() - t0, 3)
    return report


def run_files(
    paths: list[Path],
    refresh: bool = False,
    on_variant: Callable[[Variant], None] | None = None,
) -> PreflightRun:
    """``ceiling preflight``: load every variant file first (a broken one fails before any
    engine is asked), then check each; ``on_variant`` hears which one is being checked."""
    variants = [load_variant(p) for p in paths]
    result = PreflightRun()
    for variant in variants:
        if on_variant is not None:
            on_variant(variant)
        result.reports.append(run(variant, refresh=refresh))
    return result
