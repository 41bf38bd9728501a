"""Statistics across repeats: Student-t confidence intervals, Welch, bootstrap (SciPy).

A benchmark that prints one number invites people to chase noise (81.9 vs 81.4 tok/s). Every
figure we report across repeats carries a 95 % confidence interval from the t-distribution,
and comparisons use Welch's test, which does not assume equal spread in the two runs. Small
repeat counts (n = 2, 3) get the wide intervals they deserve: the quantiles are SciPy's exact
ones (``scipy.stats.t``). SciPy is imported on first use (it costs ~0.3-1 s), so modules that
only need the ``Interval``/``Welch`` models stay fast to import.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel


class Interval(BaseModel):
    """A mean and its two-sided confidence interval (``low``/``high`` None when n < 2)."""

    mean: float | None
    low: float | None = None
    high: float | None = None
    n: int = 0
    level: float = 0.95


def mean_ci(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean with a t-distribution confidence interval (sample std, n - 1 degrees of freedom)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(vals)
    if n == 0:
        return Interval(mean=None, n=0, level=level)
    m = float(np.mean(vals))
    if n < 2:
        return Interval(mean=m, n=n, level=level)
    from scipy import stats

    se = float(stats.sem(vals))  # sample std (n - 1) / sqrt(n)
    low, high = stats.t.interval(level, n - 1, loc=m, scale=se) if se > 0 else (m, m)
    return Interval(mean=m, low=float(low), high=float(high), n=n, level=level)


class Welch(BaseModel):
    """Welch's comparison of two samples: difference of means B - A and its CI."""

    mean_a: float
    mean_b: float
    diff: float
    low: float | None
    high: float | None
    df: float | None
    n_a: int
    n_b: int


def welch(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Welch:
    """Difference of means (B - A) with Welch-Satterthwaite degrees of freedom.

    With fewer than two values on a side the interval is unknown (``low``/``high`` None): one
    run per variant says nothing about run-to-run spread, and we refuse to pretend it does.
    """
    xa = np.asarray([float(v) for v in a], dtype=float)
    xb = np.asarray([float(v) for v in b], dtype=float)
    ma, mb = float(xa.mean()), float(xb.mean())
    diff = mb - ma
    if len(xa) < 2 or len(xb) < 2:
        return Welch(
            mean_a=ma, mean_b=mb, diff=diff, low=None, high=None, df=None, n_a=len(xa), n_b=len(xb)
        )
    if float(xa.var(ddof=1)) + float(xb.var(ddof=1)) == 0.0:  # no spread: exactly the diff
        return Welch(
            mean_a=ma,
            mean_b=mb,
            diff=diff,
            low=diff,
            high=diff,
            df=math.inf,
            n_a=len(xa),
            n_b=len(xb),
        )
    from scipy import stats

    res = stats.ttest_ind(xb, xa, equal_var=False)  # Welch; B first, so the CI is of B - A
    ci = res.confidence_interval(confidence_level=level)
    return Welch(
        mean_a=ma,
        mean_b=mb,
        diff=diff,
        low=float(ci.low),
        high=float(ci.high),
        df=float(res.df),
        n_a=len(xa),
        n_b=len(xb),
    )


def bootstrap_ratio_pct(
    a: Sequence[float | None],
    b: Sequence[float | None],
    *,
    invert: bool = False,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float] | None:
    """Percent change of mean(B) vs mean(A) with a percentile bootstrap interval.

    ``invert`` compares 1/mean (e.g. per-request TPOT -> tok/s: faster means a smaller TPOT).
    Resampling is within each sample, so it captures request-to-request spread only, not the
    spread between server launches; the caller must say so. Seeded: same input, same answer.
    """

    def clean(vals: Sequence[float | None]) -> np.ndarray:
        out = [float(v) for v in vals if v is not None and math.isfinite(v)]
        # Inverted quantities (TPOT -> tok/s) must be positive to have a rate at all.
        return np.asarray([v for v in out if v > 0] if invert else out, dtype=float)

    xa, xb = clean(a), clean(b)
    if len(xa) < 2 or len(xb) < 2:
        return None
    from scipy import stats

    def pct(ma: np.ndarray | float, mb: np.ndarray | float) -> np.ndarray | float:
        if invert:
            return (ma / mb - 1.0) * 100.0
        return (mb / ma - 1.0) * 100.0

    def statistic(sa: np.ndarray, sb: np.ndarray, axis: int = -1) -> np.ndarray | float:
        return pct(np.mean(sa, axis=axis), np.mean(sb, axis=axis))

    point = float(pct(float(xa.mean()), float(xb.mean())))
    res = stats.bootstrap(
        (xa, xb),
        statistic,
        n_resamples=resamples,
        paired=False,
        vectorized=True,
        confidence_level=level,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return point, float(res.confidence_interval.low), float(res.confidence_interval.high)


def bootstrap_pooled_ratio_pct(
    sums_a: Sequence[float],
    counts_a: Sequence[int],
    sums_b: Sequence[float],
    counts_b: Sequence[int],
    *,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float] | None:
    """Percent change of a pooled mean, sum(sums) / sum(counts), of B vs A, with a percentile
    bootstrap interval that resamples whole units (requests) on each side: the mean of every
    ITL sample, with the samples of one request kept together (they are not independent).

    By hand (numpy) because ``scipy.stats.bootstrap`` resamples two arrays of one side together
    only with ``paired=True``, which also ties the sides to one length. Seeded.
    """
    a = [(float(s), int(c)) for s, c in zip(sums_a, counts_a, strict=False) if c > 0]
    b = [(float(s), int(c)) for s, c in zip(sums_b, counts_b, strict=False) if c > 0]
    if len(a) < 2 or len(b) < 2:
        return None
    sa, ca = np.asarray(a).T
    sb, cb = np.asarray(b).T
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, len(a), size=(resamples, len(a)))
    ib = rng.integers(0, len(b), size=(resamples, len(b)))
    mean_a = sa[ia].sum(axis=1) / ca[ia].sum(axis=1)
    mean_b = sb[ib].sum(axis=1) / cb[ib].sum(axis=1)
    pct = (mean_b / mean_a - 1.0) * 100.0
    point = float((sb.sum() / cb.sum()) / (sa.sum() / ca.sum()) - 1.0) * 100.0
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(pct, [tail, 100.0 - tail])
    return point, float(low), float(high)


def describe(
    values: Sequence[float], percentiles: Sequence[float] = (50, 90, 99)
) -> dict[str, float | None]:
    """mean/median/std/min/max and ``p<N>`` for each percentile (population std, as ``vllm
    bench serve``; ``p99.9`` for 99.9, as its keys)."""
    vals = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    names = [f"p{int(p) if int(p) == p else p}" for p in percentiles]
    if len(vals) == 0:
        return dict.fromkeys(("mean", "median", "std", *names, "min", "max"))
    out: dict[str, float | None] = {
        "mean": float(vals.mean()),
        "median": float(np.median(vals)),
        "std": float(vals.std()),
    }
    for name, p in zip(names, percentiles, strict=True):
        out[name] = float(np.percentile(vals, p))
    out["min"], out["max"] = float(vals.min()), float(vals.max())
    return out
