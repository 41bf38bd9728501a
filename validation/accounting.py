"""Honest accounting of predict's validation rows: when each set was added, whether the model
was changed with its scores in sight, and its held-out rows as first scored.

``data/predict/reference/validation_sets.yaml`` (:class:`ValidationLedger`) lists every set of
rows predict is scored on, also the ones that are not rows of the shipped CSVs (the batch curve's
serving records, llama.cpp and vLLM runs on the H200); ``decode_validation.csv`` keeps each
held-out row's first score (``first_scored``, ``first_err_tables``, ``first_err_priors``: with
and without aiconfigurator-core's tables). :func:`held_out_account` puts a scored report
(``calibration.evaluate``) beside those first scores: the held-out rows as first scored and as
scored now, and the seen rows, each with median and 90th percentile |error|.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from ceiling.spec._data import DataModel, load_yaml
from validation.calibration import percentile, validation_csvs
from validation.calibration_report import CalibrationReport, ErrorStats, RowResult


class FirstFigures(DataModel):
    n: int
    median_abs_error_pct: float
    p90_abs_error_pct: float


class ValidationSet(DataModel):
    """One set of validation rows."""

    name: str
    rows: str
    kind: str
    added: str
    seen: Literal["yes", "no", "per-row"]
    note: str
    result: str | None = None
    evidence: str | None = None
    first: FirstFigures | None = None


class ValidationLedger(DataModel):
    """``data/predict/reference/validation_sets.yaml``."""

    schema_version: int
    sets: list[ValidationSet]


def ledger() -> ValidationLedger:
    return load_yaml("predict/reference/validation_sets.yaml", schema=ValidationLedger)


class FirstScore(BaseModel):
    """A held-out row's first score (the evidence state of this run) beside its score now."""

    id: str
    added: str
    first_scored: str
    first_error_pct: float | None  # None: not recorded
    error_pct: float | None  # None: not modelled now


class HeldOutAccount(BaseModel):
    """The held-out rows as first scored and now, and the seen rows, scored (``use: all``)."""

    evidence: Literal["tables", "priors"]
    rows: list[FirstScore]
    held_out_first: ErrorStats
    held_out_now: ErrorStats
    seen_now: ErrorStats


def first_scores(paths: list[Path] | None = None) -> dict[str, dict[str, str]]:
    """id -> the row's accounting columns, for every held-out row of the validation files."""
    out = {}
    for p in paths or validation_csvs():
        for row in csv.DictReader(p.open()):
            if (row.get("seen") or "yes").strip().lower() == "no":
                out[row["id"]] = row
    return out


def _stats(errs: list[float]) -> ErrorStats:
    a = [abs(e) for e in errs]
    return ErrorStats(
        n=len(a),
        median_abs_error_pct=round(percentile(a, 50), 1) if a else None,
        p90_abs_error_pct=round(percentile(a, 90), 1) if a else None,
        max_abs_error_pct=round(max(a), 1) if a else None,
        bound_violations=0,
        median_tightness=None,
    )


def _float(text: str | None) -> float | None:
    return float(text) if text not in (None, "") else None


def held_out_account(report: CalibrationReport, with_tables: bool) -> HeldOutAccount:
    """The held-out rows (``use: all``: scored for the error figures) as first scored under the
    same evidence (tables or priors) and as scored in ``report``; the seen rows beside them."""
    rows = first_scores()
    now: dict[str, RowResult] = {r.id: r for r in report.modelled}
    col = "first_err_tables" if with_tables else "first_err_priors"
    out = []
    for rid, row in rows.items():
        if (row.get("use") or "all") != "all":
            continue
        m = now.get(rid)
        out.append(
            FirstScore(
                id=rid,
                added=row.get("added", ""),
                first_scored=row.get("first_scored", ""),
                first_error_pct=_float(row.get(col)),
                error_pct=m.error_pct if m is not None else None,
            )
        )
    seen = [r.error_pct for r in report.modelled if r.use == "all" and not r.held_out]
    return HeldOutAccount(
        evidence="tables" if with_tables else "priors",
        rows=out,
        held_out_first=_stats([r.first_error_pct for r in out if r.first_error_pct is not None]),
        held_out_now=_stats([r.error_pct for r in out if r.error_pct is not None]),
        seen_now=_stats(seen),
    )
