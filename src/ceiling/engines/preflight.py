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

from ceiling.engines import get_engine
from ceiling.engines.base import EngineInstall
from ceiling.engines.flagcheck import check_args, check_env
from ceiling.engines.flags import Problem
from ceiling.engines.preflight_model import PreflightReport, PreflightRun
from ceiling.engines.variant import Variant

__all__ = [
    "PreflightReport",
    "PreflightRun",
    "Problem",
    "check_args",
    "check_env",
    "check_variant",
]


def check_variant(
    variant: Variant, refresh: bool = False, install: EngineInstall | None = None
) -> PreflightReport:
    """Check ``variant``'s model path, flags and environment variables against the installed
    engine (its own argument parser, cached per version). The environment of the engine's
    Python (``ceiling env``) is the flow's stage: ``ceiling.flows.preflight.run``.
    ``install``: where the engine was found (default: ``engine.locate(variant)``)."""
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
    install = install or engine.locate(variant)
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
    report.elapsed_s = round(time.monotonic() - t0, 3)
    return report
