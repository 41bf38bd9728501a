"""Statistics: CIs (t quantiles from SciPy, checked against the printed table), Welch, bootstrap."""

from __future__ import annotations

import math
from statistics import mean, variance

import pytest

from ceiling.bench.stats import bootstrap_ratio_pct, describe, mean_ci, welch


def test_mean_ci_width_and_single_value() -> None:
    iv = mean_ci([10.0, 12.0, 14.0])
    # mean 12, s = 2, se = 2/sqrt(3), t(0.975, 2) = 4.3027
    half = 4.3027 * 2 / math.sqrt(3)
    assert iv.mean == pytest.approx(12.0)
    assert iv.low == pytest.approx(12 - half, abs=1e-3)
    assert iv.high == pytest.approx(12 + half, abs=1e-3)
    one = mean_ci([5.0])
    assert one.mean == 5.0 and one.low is None and one.high is None
    assert mean_ci([]).mean is None


def test_welch_founding_example_is_noise() -> None:
    # Baseline 81.4 tok/s, NCCL-tuned 81.9 tok/s, with a run-to-run spread of ~1 tok/s.
    w = welch([81.4, 80.6, 82.2], [81.9, 81.0, 82.7])
    assert w.low is not None and w.high is not None
    assert w.low < 0 < w.high


def test_welch_matches_the_satterthwaite_formula_by_hand() -> None:
    # Welch-Satterthwaite by hand (stdlib variances: 0.64 and 0.7233, n = 3 each)
    a, b = [81.4, 80.6, 82.2], [81.9, 81.0, 82.7]
    va, vb = variance(a) / 3, variance(b) / 3
    w = welch(a, b)
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    assert w.df == pytest.approx(df, rel=1e-4)
    # t(0.975, 3.985) sits between the table's df=3 (3.1824) and df=4 (2.7764) rows
    half = (w.high - w.low) / 2
    assert 2.7764 < half / math.sqrt(va + vb) < 3.1824
    assert w.diff == pytest.approx(mean(b) - mean(a))
    same = welch([5.0, 5.0], [6.0, 6.0])  # no spread at all: the difference is exact
    assert (same.low, same.high) == (1.0, 1.0)


def test_welch_detects_a_real_difference_and_refuses_one_run() -> None:
    w = welch([81.4, 81.5, 81.3], [85.0, 85.2, 84.9])
    assert w.low is not None and w.low > 0
    single = welch([81.4], [81.9])
    assert single.low is None and single.high is None


def test_bootstrap_is_seeded_and_directional() -> None:
    a = [10.0 + 0.1 * (i % 7) for i in range(50)]  # TPOT ms
    b = [9.0 + 0.1 * (i % 5) for i in range(50)]  # 10 % lower TPOT: faster
    r1 = bootstrap_ratio_pct(a, b, invert=True)
    r2 = bootstrap_ratio_pct(a, b, invert=True)
    assert r1 == r2
    assert r1 is not None and r1[1] > 5.0  # tok/s up by > 5 % with confidence
    same = bootstrap_ratio_pct(a, list(reversed(a)), invert=True)
    assert same is not None and same[1] < 0 < same[2]
    assert bootstrap_ratio_pct([1.0], [2.0]) is None


def test_describe_handles_empty_and_values() -> None:
    d = describe([1.0, 2.0, 3.0, 4.0])
    assert d["mean"] == 2.5 and d["median"] == 2.5 and d["max"] == 4.0
    assert describe([])["mean"] is None
