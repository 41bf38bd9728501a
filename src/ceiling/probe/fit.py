"""Alpha-beta fits and bandwidth arithmetic for collectives (nccl-tests conventions).

t(bytes) = alpha_us + bytes / (beta_GBps * 1e3). Fitted by least squares on *relative* error,
because decode lives at the small-message end: an absolute fit would let the 64 MB points decide
alpha, which is the one number decode cares about.
"""

from __future__ import annotations

import itertools
import math
import statistics


def algbw_GBps(size_bytes: int, time_us: float) -> float:
    """Bytes the caller reduced per second (nccl-tests 'algbw')."""
    return size_bytes / (time_us * 1e3) if time_us > 0 else 0.0


def busbw_GBps(size_bytes: int, time_us: float, world_size: int) -> float:
    """Allreduce bus bandwidth: algbw * 2(n-1)/n (nccl-tests' PERFORMANCE.md)."""
    if world_size < 2:
        return 0.0
    return algbw_GBps(size_bytes, time_us) * 2 * (world_size - 1) / world_size


def fit_alpha_beta(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Return (alpha_us, beta_GBps) fitted to (bytes, us) points; beta may be inf if flat."""
    pts = [(float(b), float(t)) for b, t in points if t > 0]
    if not pts:
        raise ValueError("no points to fit")
    if len(pts) == 1:
        return pts[0][1], math.inf
    # weighted normal equations for t = a + s*x with weights 1/t (relative error)
    sw = sx = sy = sxx = sxy = 0.0
    for x, t in pts:
        w = 1.0 / (t * t)
        sw += w
        sx += w * x
        sy += w * t
        sxx += w * x * x
        sxy += w * x * t
    det = sw * sxx - sx * sx
    if det <= 0:
        return min(t for _, t in pts), math.inf
    slope = (sw * sxy - sx * sy) / det
    alpha = (sy - slope * sx) / sw
    if alpha < 0:  # refit through the origin
        alpha = 0.0
        slope = sxy / sxx
    if slope <= 0:  # flat (latency-bound everywhere measured): alpha is the typical time
        return statistics.median(t for _, t in pts), math.inf
    return alpha, 1.0 / (slope * 1e3)


def interp_latency(points: list[tuple[int, float]], size: int) -> float:
    """Latency at ``size`` bytes, log-log interpolated between measured points (clamped)."""
    pts = sorted(points)
    if not pts:
        raise ValueError("no points")
    if size <= pts[0][0]:
        return pts[0][1]
    if size >= pts[-1][0]:
        return pts[-1][1] * size / pts[-1][0]
    for (b0, t0), (b1, t1) in itertools.pairwise(pts):
        if b0 <= size <= b1:
            if b0 == b1:
                return t0
            f = (math.log(size) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    return pts[-1][1]


def parse_size(text: str) -> int:
    """'14K' -> 14336, '64M' -> 67108864, '4096' -> 4096 (K/M/G are powers of 1024)."""
    s = text.strip().upper().rstrip("B")
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(s[-1:], 1)
    if mult != 1:
        s = s[:-1]
    value = float(s) * mult
    if not math.isfinite(value) or value <= 0:  # int(inf) would raise OverflowError
        raise ValueError(f"size must be a positive number: {text}")
    return int(value)


def parse_sizes(text: str) -> list[int]:
    """'1K..64M' (powers of two between) or a comma list '1K,14K,1M'."""
    if ".." in text:
        lo, hi = (parse_size(p) for p in text.split("..", 1))
        out, s = [], lo
        while s <= hi:
            out.append(s)
            s *= 2
        return out
    return sorted({parse_size(p) for p in text.split(",") if p.strip()})


def human_size(n: int) -> str:
    """1024 -> '1K', 14336 -> '14K', 67108864 -> '64M'."""
    if n >= 1024**2:
        return f"{n / 1024**2:.4g}M"
    if n >= 1024:
        return f"{n / 1024:.4g}K"
    return str(n)
