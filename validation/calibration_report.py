"""The nouns of predict's validation against published runs (:mod:`validation.calibration`):
one scored row, the error figures of a set of rows, the whole evaluation, one before/after pair,
and the speculative decoding a row names. Their JSON is what ``experiments/validation/
predict_accuracy.py --json`` prints (the same keys as the dicts they replace)."""

from __future__ import annotations

from pydantic import BaseModel


class RowResult(BaseModel):
    id: str
    file: str
    use: str
    metric: str
    concurrency: int
    engine: str
    gpu: str
    weight_format: str
    moe: bool
    measured: float
    expected: float
    bound: float
    error_pct: float  # + = predicted faster than measured, in every metric
    bound_margin_pct: float  # how far the measurement is from the bound (+: below the bound)
    tightness: float  # bound / measured, in speed terms (1: measured at the bound)
    violation: bool
    held_out: bool  # scored before any model change made with it in sight (`seen: no`)
    added: str
    spec: str = "none"  # speculative decoding method of the row


class SkippedRow(BaseModel):
    id: str
    why: str


class ErrorStats(BaseModel):
    """|error| of ``expected`` over a set of rows (None: no rows), violations, tightness."""

    n: int
    median_abs_error_pct: float | None
    p90_abs_error_pct: float | None
    max_abs_error_pct: float | None
    bound_violations: int
    # how far above the measurements the bound sits (bound / measured, speed terms)
    median_tightness: float | None


class CalibrationReport(BaseModel):
    """Every row of the validation files, scored (``calibration.evaluate``)."""

    rows: int
    modelled: list[RowResult]
    skipped: list[SkippedRow]
    single_stream: ErrorStats
    all_rows: ErrorStats
    # held-out rows (scored before any change made with them in sight) apart from the rest
    held_out_single_stream: ErrorStats
    seen_single_stream: ErrorStats
    held_out_all_rows: ErrorStats
    held_out_ids: list[str]
    # the held-out rows with more than one stream (the batch curve's), and every held-out set
    # apart by when it was added ('2026-11-30 46297e8 single' / '... all'): a set scored once
    # stays comparable with itself when later sets join
    held_out_batch: ErrorStats
    held_out_by_added: dict[str, ErrorStats]
    # the rows without speculative decoding (the set the ratchet was first set on) and the
    # speculative-decoding rows apart
    no_spec_single_stream: ErrorStats
    spec_single_stream: ErrorStats
    by_group: dict[str, ErrorStats]  # "engine=vllm", "gpu=h200", "format=fp8", "moe=dense"...
    bound_violations: list[str]
    # kept for the old callers: the headline over every scored row
    median_abs_error_pct: float | None
    max_abs_error_pct: float | None


class PairResult(BaseModel):
    """One measured before/after pair (``whatif_pairs.csv``'s columns) with the measured and the
    predicted change in speed; ``skipped`` (and no figures) when a side cannot be modelled."""

    id: str
    kind: str
    before: str
    after: str
    notes: str = ""
    source: str = ""
    added: str = ""
    seen: str = ""
    seen_note: str = ""
    skipped: str | None = None
    measured_delta_pct: float | None = None
    predicted_delta_pct: float | None = None
    # counted only when the prediction's sign matches (no pass for small changes)
    right_sign: bool = False
    held_out: bool = False
    gap_points: float | None = None
    within_5_points: bool = False


class SpecDecoding(BaseModel):
    """The speculative decoding a row's ``spec_decode`` column names: the PredictRequest fields
    it sets (the acceptance rate or length only when the row's notes report one)."""

    spec: str
    spec_tokens: int | None
    spec_acceptance_rate: float | None = None
    spec_acceptance_length: float | None = None
