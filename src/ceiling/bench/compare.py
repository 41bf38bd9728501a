"""``ceiling compare``: is B really different from A, or is it noise?

Two intervals per metric:
- **across repeats** (Welch on the per-repeat values): covers run-to-run spread, including
  relaunching the server; this is the one the verdict uses when both sides have >= 2 repeats.
- **bootstrap over per-request values** (e.g. TPOT): covers request-to-request spread within a
  run only. With a single run per side it is all we have, and the verdict says so.

The verdict is "no significant difference" whenever the interval contains zero.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from ceiling.bench.config import DEFAULT_MAX_TOKENS
from ceiling.bench.results import CI_METRICS, LevelResult, RunResult, Summary
from ceiling.bench.stats import bootstrap_pooled_ratio_pct, bootstrap_ratio_pct, welch
from ceiling.errors import CeilingError

SAME = "no significant difference"
FASTER = "B faster"
SLOWER = "B slower"
UNLIKE = "unlike workloads: no verdict"
#: Measured mean prompt or output tokens per request further apart than this (relative) make
#: two runs unlike workloads, whatever their options said (EOS stops, another dataset).
UNLIKE_TOKENS = 0.05

#: Summary metric -> (per-request series, invert) for the bootstrap. ``mean_itl_ms`` is the
#: mean of every ITL sample: it is bootstrapped from the per-request ITL sums and counts
#: (:func:`_bootstrap`), never from TPOT (they differ when a chunk carries several tokens).
_BOOTSTRAP = {
    "decode_tok_s_per_stream": ("tpot_ms", True),
    "mean_tpot_ms": ("tpot_ms", False),
    "mean_ttft_ms": ("ttft_ms", False),
    "mean_e2el_ms": ("e2el_ms", False),
}


class ComparisonRow(BaseModel):
    """B (one file) against A at one level, for one metric."""

    label_b: str
    concurrency: int | None
    metric: str
    better: str
    a: float | None
    b: float | None
    delta_pct: float | None
    ci_pct: list[float] | None = None
    basis: str = "none"
    repeats: list[int] = Field(default_factory=list)
    bootstrap_ci_pct: list[float] | None = None
    verdict: str = SAME
    note: str = ""


class Comparison(BaseModel):
    """All rows; the top-level fields repeat the first row (B = second file, first level)."""

    schema_version: int = 1
    kind: str = "ceiling.compare"
    baseline: str
    metric: str
    verdict: str
    delta_pct: float | None
    ci_pct: list[float] | None
    rows: list[ComparisonRow]
    like_workloads: bool = True
    warnings: list[str] = Field(default_factory=list)


def _values(level: LevelResult, metric: str) -> list[float]:
    out = []
    for rep in level.repeats:
        v = getattr(rep, metric, None)
        if v is None and rep.model_extra:
            v = rep.model_extra.get(metric)
        if isinstance(v, int | float):
            out.append(float(v))
    return out


def _level_value(level: LevelResult, metric: str) -> float | None:
    v = getattr(level, metric, None)
    if v is None and level.model_extra:
        v = level.model_extra.get(metric)
    return float(v) if isinstance(v, int | float) else None


def _direction(delta: float, better: str) -> str:
    improved = delta > 0 if better == "higher" else delta < 0
    return FASTER if improved else SLOWER


def _bootstrap(a: LevelResult, b: LevelResult, metric: str) -> tuple[float, float, float] | None:
    """The request-to-request interval of ``metric`` (None: no per-request values for it)."""
    pa, pb = a.per_request, b.per_request
    if metric == "mean_itl_ms":
        return bootstrap_pooled_ratio_pct(pa.itl_sum_ms, pa.itl_count, pb.itl_sum_ms, pb.itl_count)
    if metric not in _BOOTSTRAP:
        return None
    series, invert = _BOOTSTRAP[metric]
    return bootstrap_ratio_pct(getattr(pa, series), getattr(pb, series), invert=invert)


def compare_levels(
    a: LevelResult, b: LevelResult, metric: str, label_b: str = "B"
) -> ComparisonRow:
    """One row: delta %, intervals and verdict for ``metric`` (see module docstring)."""
    better = CI_METRICS.get(metric, "lower" if metric.endswith("_ms") else "higher")
    va, vb = _values(a, metric), _values(b, metric)
    ma = sum(va) / len(va) if va else _level_value(a, metric)
    mb = sum(vb) / len(vb) if vb else _level_value(b, metric)
    row = ComparisonRow(
        label_b=label_b,
        concurrency=a.concurrency,
        metric=metric,
        better=better,
        a=ma,
        b=mb,
        delta_pct=(mb / ma - 1.0) * 100.0 if ma and mb is not None else None,
        repeats=[len(va), len(vb)],
    )
    boot = _bootstrap(a, b, metric)
    if boot is not None:
        row.bootstrap_ci_pct = [boot[1], boot[2]]
    if len(va) >= 2 and len(vb) >= 2 and ma:
        w = welch(va, vb)
        assert w.low is not None and w.high is not None
        row.ci_pct = [w.low / ma * 100.0, w.high / ma * 100.0]
        row.basis = "repeats"
    elif row.bootstrap_ci_pct is not None:
        row.ci_pct = row.bootstrap_ci_pct
        row.basis = "requests"
        row.note = (
            "fewer than 2 repeats on a side: the interval covers request-to-request spread "
            "only, not run-to-run (relaunch) spread; use --repeat 3 or more"
        )
    else:
        row.note = "no interval: need --repeat >= 2 on both sides (or per-request values)"
        return row
    low, high = row.ci_pct
    if low <= 0.0 <= high or row.delta_pct is None:
        row.verdict = SAME
    else:
        row.verdict = _direction(row.delta_pct, better)
    return row


def metrics_of(result: RunResult) -> set[str]:
    """The summary keys a result knows (what ``--metric`` may name), valued or not."""
    keys = set(Summary.model_fields)
    for lv in [result, *result.levels]:
        for holder in [lv, *lv.repeats]:
            keys.update(k for k, v in (holder.model_extra or {}).items() if _is_number(v))
    return keys


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _check_metric(results: list[RunResult], metric: str, labels: list[str]) -> None:
    """A metric no result knows is a typo, not "no significant difference"."""
    for res, label in zip(results, labels, strict=True):
        if metric not in metrics_of(res):
            raise CeilingError(
                f"{label} has no metric {metric!r}",
                fix="pass --metric one of: " + ", ".join(sorted(metrics_of(res))),
            )


def _check_numbers(result: RunResult, label: str) -> None:
    """Every number compare may use is finite and not negative (times, rates, counts): a
    hand-edited or foreign file with ``-5`` ms or ``1e999`` is refused, never given a verdict."""
    for lv in [result, *result.levels]:
        for holder in [lv, *lv.repeats]:
            values = {k: getattr(holder, k) for k in Summary.model_fields}
            values.update(holder.model_extra or {})
            for key, v in values.items():
                if _is_number(v) and not (math.isfinite(v) and v >= 0):
                    raise CeilingError(
                        f"{label}: {key} = {v!r} is not a measurement (negative or not finite)",
                        fix="compare result files as ceiling bench wrote them",
                    )
        for series, vals in lv.per_request.model_dump().items():
            bad = [v for v in vals if _is_number(v) and not (math.isfinite(v) and v >= 0)]
            if bad and series != "repeat":
                raise CeilingError(
                    f"{label}: per_request.{series} holds {bad[0]!r} (negative or not finite)",
                    fix="compare result files as ceiling bench wrote them",
                )


def _check_values(rows: list[ComparisonRow], results: list[RunResult], labels: list[str]) -> None:
    """A side without a value (no request completed, or the metric was never measured) is no
    comparison: refuse it instead of calling it noise."""
    by_label = dict(zip(labels, results, strict=True))
    for row in rows:
        for side, value, label in (("A", row.a, labels[0]), ("B", row.b, row.label_b)):
            if value is not None:
                continue
            res = by_label[label]
            lv = res.level(row.concurrency) or res
            at = f" at concurrency {row.concurrency}" if row.concurrency is not None else ""
            raise CeilingError(
                f"{label} ({side}) has no {row.metric}{at}: {lv.completed} request(s) completed "
                f"(errors: {lv.errors or 'none recorded'}); there is nothing to compare",
                fix="re-run that bench against a working server, or pick another --metric",
            )


def _check_completed(level: LevelResult, label: str, side: str) -> None:
    """A level where no request completed measured nothing: its rates read 0.0, and a delta
    against them (-100 %, "B slower") would be a verdict drawn from failures, not from speed."""
    if level.completed > 0:
        return
    at = f" at concurrency {level.concurrency}" if level.concurrency is not None else ""
    raise CeilingError(
        f"{label} ({side}): no request completed{at} ({level.failed} failed, errors: "
        f"{level.errors or 'none recorded'}); there is nothing to compare",
        fix="re-run that bench against a working server (read its errors first), then compare "
        "the new result file",
    )


def _workload(res: RunResult) -> dict[str, object]:
    """What a run asked the server for: lengths, prompt source, endpoint."""
    cfg = res.config
    max_tokens = cfg.get("max_tokens") or DEFAULT_MAX_TOKENS.get(res.mode)
    return {
        "input length": None if cfg.get("dataset") else cfg.get("input_len"),
        "max tokens": max_tokens,
        "dataset": cfg.get("dataset"),
        "endpoint": res.endpoint or None,
        # the same lengths on average, another workload: a cached prefix or a resent history
        # serves prompts faster; a spread of lengths batches differently (older results: none)
        "input range": cfg.get("input_range", 0.0),
        "output range": cfg.get("output_range", 0.0),
        "shared prefix": cfg.get("prefix_len", 0),
        "turns": cfg.get("turns", 1),
    }


def _per_request(lv: LevelResult) -> tuple[float, float] | None:
    if not lv.completed:
        return None
    return lv.total_input_tokens / lv.completed, lv.total_output_tokens / lv.completed


def unlike_workloads(a: RunResult, b: RunResult, label_a: str, label_b: str) -> list[str]:
    """Why A and B did not measure the same workload (empty: they did). A speed difference
    between a 128-token and a 2048-token prompt is the workload's, not the server's."""
    out = []
    wa, wb = _workload(a), _workload(b)
    for key, va in wa.items():
        if va != wb[key]:
            out.append(f"{key}: {label_a} {va}, {label_b} {wb[key]}")
    for lv in a.levels:
        other = b.level(lv.concurrency)
        pa, pb = _per_request(lv), _per_request(other) if other is not None else None
        if pa is None or pb is None:
            continue
        for name, x, y in (("prompt", pa[0], pb[0]), ("output", pa[1], pb[1])):
            if max(x, y) > 0 and abs(x - y) / max(x, y) > UNLIKE_TOKENS:
                at = f" at c={lv.concurrency}" if lv.concurrency is not None else ""
                out.append(
                    f"measured {name} tokens per request{at}: {label_a} {x:.1f}, {label_b} {y:.1f}"
                )
    return out


def compare(
    results: list[RunResult],
    metric: str = "decode_tok_s_per_stream",
    labels: list[str] | None = None,
) -> Comparison:
    """Compare every result after the first against the first, level by level."""
    if len(results) < 2:
        raise CeilingError(
            "compare needs at least two results", fix="ceiling compare A.json B.json"
        )
    labels = labels or [f"run{i}" for i in range(len(results))]
    _check_metric(results, metric, labels)
    for res, label in zip(results, labels, strict=True):
        _check_numbers(res, label)
    base = results[0]
    rows: list[ComparisonRow] = []
    for res, label in zip(results[1:], labels[1:], strict=True):
        shared = [lv for lv in base.levels if res.level(lv.concurrency) is not None]
        if not shared:
            raise CeilingError(
                f"{label} has no level in common with {labels[0]}",
                fix="compare runs of the same mode and concurrency levels",
            )
        for lv in shared:
            other = res.level(lv.concurrency)
            assert other is not None
            _check_completed(lv, labels[0], "A")
            _check_completed(other, label, "B")
            rows.append(compare_levels(lv, other, metric, label))
    _check_values(rows, results, labels)
    warnings = []
    for res, label in zip(results[1:], labels[1:], strict=True):
        unlike = unlike_workloads(base, res, labels[0], label)
        if not unlike:
            continue
        warnings.append(
            f"{label} ran another workload than {labels[0]} (" + "; ".join(unlike) + "): "
            "the difference is not the server's, so no winner is called"
        )
        for row in rows:
            if row.label_b == label:
                row.verdict = UNLIKE
    first = rows[0]
    return Comparison(
        baseline=labels[0],
        metric=metric,
        verdict=first.verdict,
        delta_pct=first.delta_pct,
        ci_pct=first.ci_pct,
        rows=rows,
        like_workloads=not warnings,
        warnings=warnings,
    )
