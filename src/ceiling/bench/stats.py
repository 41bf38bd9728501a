"""Statistics without SciPy: Student-t quantiles, confidence intervals, Welch, bootstrap.

A benchmark that prints one number invites people to chase noise (81.9 vs 81.4 tok/s). Every
figure we report across repeats carries a 95 % confidence interval from the t-distribution,
and comparisons use Welch's test, which does not assume equal spread in the two runs.
The t quantile is computed exactly from the regularized incomplete beta function (a continued
fraction), so small repeat counts (n = 2, 3) get the wide intervals they deserve.
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


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Cumulative distribution of Student's t with ``df`` degrees of freedom."""
    x = df / (df + t * t)
    tail = 0.5 * betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t > 0 else tail


def t_ppf(p: float, df: float) -> float:
    """Quantile of Student's t (bisection on the exact CDF; p in (0, 1))."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
        if hi > 1e12:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def mean_ci(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean with a t-distribution confidence interval (sample std, n - 1 degrees of freedom)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(vals)
    if n == 0:
        return Interval(mean=None, n=0, level=level)
    m = float(np.mean(vals))
    if n < 2:
        return Interval(mean=m, n=n, level=level)
    se = float(np.std(vals, ddof=1)) / math.sqrt(n)
    half = t_ppf(0.5 + level / 2.0, n - 1) * se
    return Interval(mean=m, low=m - half, high=m + half, n=n, level=level)


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
    va, vb = float(xa.var(ddof=1)) / len(xa), float(xb.var(ddof=1)) / len(xb)
    se2 = va + vb
    if se2 == 0.0:
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
    df = se2 * se2 / (va * va / (len(xa) - 1) + vb * vb / (len(xb) - 1))
    half = t_ppf(0.5 + level / 2.0, df) * math.sqrt(se2)
    return Welch(
        mean_a=ma,
        mean_b=mb,
        diff=diff,
        low=diff - half,
        high=diff + half,
        df=df,
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
    rng = np.random.default_rng(seed)
    ma = xa[rng.integers(0, len(xa), size=(resamples, len(xa)))].mean(axis=1)
    mb = xb[rng.integers(0, len(xb), size=(resamples, len(xb)))].mean(axis=1)

    def pct(ma_: np.ndarray | float, mb_: np.ndarray | float) -> np.ndarray | float:
        if invert:
            return (ma_ / mb_ - 1.0) * 100.0
        return (mb_ / ma_ - 1.0) * 100.0

    point = float(pct(float(xa.mean()), float(xb.mean())))
    dist = np.asarray(pct(ma, mb))
    alpha = (1.0 - level) / 2.0
    return point, float(np.quantile(dist, alpha)), float(np.quantile(dist, 1.0 - alpha))


def describe(values: Sequence[float]) -> dict[str, float | None]:
    """mean/median/std/p50/p90/p99/min/max (population std, as ``vllm bench serve``)."""
    vals = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if len(vals) == 0:
        return dict.fromkeys(("mean", "median", "std", "p50", "p90", "p99", "min", "max"))
    return {
        "mean": float(vals.mean()),
        "median": float(np.median(vals)),
        "std": float(vals.std()),
        "p50": float(np.percentile(vals, 50)),
        "p90": float(np.percentile(vals, 90)),
        "p99": float(np.percentile(vals, 99)),
        "min": float(vals.min()),
        "max": float(vals.max()),
    }
