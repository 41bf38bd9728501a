"""A fused-MoE kernel's latency at a shape its table lacks, from two shapes it holds.

The tables measure a fused-MoE kernel at a few models' shapes (hidden x inter x experts x
top-k) per TP. At decode its time follows the bytes of the experts one rank reads, so another
model's shape is read between two measured ones in those bytes (log-log). The two are chosen
once per op, at one token, and kept for every token count: chosen at each token count, the
neighbours in bytes changed with the batch (shapes saturate their experts at different token
counts, so their order in bytes moves) and the step fell as the batch grew (GLM-4.7 FP8 on the
H200, TP=4: 25.95 ms at 12 sequences, 24.77 at 13).
"""

from __future__ import annotations

from ceiling.predict.tables.interp import _extend, _log_log_interp

#: one measured series: (hidden, inter, experts, top-k, moe_tp) and its [(tokens, us)] rows
Series = tuple[tuple[int, int, int, int, int], list[tuple[float, float]]]


def _rank_bytes(shape: tuple[int, int, int, int, int], tokens: float, bpp: float) -> float:
    """Expert bytes one rank reads at ``tokens``: the touched experts (at most all of them)."""
    h, i, e, k, tp = shape
    return min(e, max(tokens, 1.0) * k) * 3 * h * i / tp * bpp


def _series(shapes: dict[str, list[list[float]]]) -> list[Series]:
    out: list[Series] = []
    for shp, rows in sorted(shapes.items()):
        h, i, e, k = (int(x) for x in shp.split("x"))
        for tp in sorted({int(r[1]) for r in rows}):
            sub = [(float(r[0]), float(r[2])) for r in rows if int(r[1]) == tp]
            if sub:
                out.append(((h, i, e, k, tp), sub))
    return out


def _pair(series: list[Series], want: tuple[int, int, int, int, int], bpp: float) -> list[Series]:
    """The two series that bracket ``want`` in the bytes one token reads (the nearest two on one
    side when none brackets it): a choice that does not depend on the batch."""
    w1 = _rank_bytes(want, 1.0, bpp)
    ranked = sorted(series, key=lambda s: (_rank_bytes(s[0], 1.0, bpp), s[0]))
    below = [s for s in ranked if _rank_bytes(s[0], 1.0, bpp) <= w1]
    above = [s for s in ranked if _rank_bytes(s[0], 1.0, bpp) > w1]
    if below and above:
        return [below[-1], above[0]]
    return below[-2:] if below else above[:2]


def moe_other_shapes(
    shapes: dict[str, list[list[float]]],
    key: str,
    tokens: float,
    want: tuple[int, int, int, int, int],
    bpp: float,
) -> tuple[float, str] | None:
    """(us, note) of the kernel at ``want`` (hidden, inter, experts, top-k, moe_tp) from two of
    its measured shapes (``bpp``: bytes per expert parameter of the table's dtype), or None
    when the table holds fewer than two series."""
    pair = _pair(_series(shapes), want, bpp)
    if len(pair) < 2:
        return None
    rows = sorted({t for _shape, sub in pair for t, _us in sub})
    pts = []
    for t in rows:
        at = [(_rank_bytes(shape, t, bpp), _extend(t, sub)) for shape, sub in pair]
        pts.append((t, _log_log_interp(_rank_bytes(want, t, bpp), at)))
    us = _extend(max(tokens, 1.0), pts)
    names = " and ".join("x".join(str(v) for v in s[0][:4]) + f"@tp{s[0][4]}" for s in pair)
    h, i, e, k, _tp = want
    wb = _rank_bytes(want, tokens, bpp)
    note = (
        f"no rows at {h}x{i}x{e}x{k}: interpolated in per-rank expert bytes between {names} "
        f"({wb / 1e6:.1f} MB)"
    )
    return us, note
