"""Interpolation over measured rows: along the axes on which a kernel does more work (tokens,
batch, context), in log-log over bytes, and past the last measured row."""

from __future__ import annotations

import itertools
import math

#: a row over this many times both its neighbours along the axis is a warm-up spike (the ratio
#: of the evidence check that rejects a table row against the prior, evidence.yaml table_check)
SPIKE_RATIO = 3.0


def _despiked(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted points without spikes: rows over ``SPIKE_RATIO`` x the higher of their neighbours.

    Read into the rising envelope, one spike became a plateau: the H200's TensorRT-LLM MLA
    table holds 2223 us at 32 sequences and 4 tokens of context (14.8 us either side), so
    every row with 32 or more sequences read >= 2.2 ms up to 128 sequences at 64k tokens, and
    DeepSeek-V3 on the H200 (TP=8) ran 129 ms of its 165 ms step in MLA at 64-256 sequences."""
    pts = sorted(pts)
    keep = []
    for i, (x, y) in enumerate(pts):
        near = [pts[j][1] for j in (i - 1, i + 1) if 0 <= j < len(pts)]
        if not near or y <= SPIKE_RATIO * max(near):
            keep.append((x, y))
    return keep


def _envelope(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted points without spikes (``_despiked``), each read as the highest latency up to it
    (a rising envelope)."""
    return list(itertools.accumulate(_despiked(pts), lambda a, b: (b[0], max(a[1], b[1]))))


def _log_interp(x: float, pts: list[tuple[float, float]]) -> float:
    """y at x by interpolation in log x over sorted (x, y) points (clamped at the ends).

    Every axis read this way (tokens, batch, context) is one along which the same kernel does
    more work, so a row below an earlier one is measurement noise: each point is read as the
    highest latency up to it (a rising envelope). Read as measured, a dip let the decode step
    fall as the batch grew (GLM-4.7 FP8 on the H200: 25.95 ms at 12 sequences, 24.77 at 13)."""
    pts = _envelope(pts)
    if x <= pts[0][0]:
        return pts[0][1]
    if x >= pts[-1][0]:
        return pts[-1][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x0 <= x <= x1:
            if x1 == x0:
                return y0
            w = math.log(x / x0) / math.log(x1 / x0)
            return y0 + w * (y1 - y0)
    return pts[-1][1]


def _extend(x: float, pts: list[tuple[float, float]]) -> float:
    """``_log_interp`` along tokens or batch, also past the last measured row: there the
    latency goes on along the envelope's last segment, linear in x (the tables keep rows up
    to ``RAW_MAX_TOKENS``; more tokens or sequences are more of the same work per row).

    Past its last row an op used to leave its table for another engine's or for the prior,
    which disagree with it by up to 4x at 256 tokens: the step fell as the batch grew (DeepSeek-V3
    on the H200, TP=8: 166.7 ms at 256 sequences, 43.8 at 384). Continued along its own last
    segment, the table meets itself at its last row and never falls (the envelope's segments
    do not descend); one row alone is held flat."""
    env = _envelope(pts)
    if x <= env[-1][0] or len(env) < 2:
        return _log_interp(x, pts)
    (x0, y0), (x1, y1) = env[-2], env[-1]
    return y1 + (x - x1) * (y1 - y0) / (x1 - x0)


def _log_log_interp(x: float, pts: list[tuple[float, float]]) -> float:
    """y at x by log-log interpolation over (x, y) points; beyond the ends, in proportion."""
    pts = sorted(pts)
    if x <= pts[0][0]:
        return pts[0][1]
    if x >= pts[-1][0]:
        return pts[-1][1] * x / pts[-1][0]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x0 <= x <= x1 and x1 > x0:
            w = math.log(x / x0) / math.log(x1 / x0)
            return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))
    return pts[-1][1]
