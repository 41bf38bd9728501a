"""Hand-written inline SVG plots for the reports.

Why hand-written: the HTML report must be one self-contained file that opens anywhere without
network access or JavaScript, and a plotting library would add a heavy dependency for five simple
chart types. Every function returns an ``<svg>`` string (with a ``<title>`` for accessibility) or
an empty-state ``<svg>`` that says what is missing, so a report never breaks on absent data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

# Colour per attribution kind and a palette for series (colour-blind safe: Okabe-Ito).
KIND_COLOURS = {
    "fundamental": "#0072B2",
    "configurable": "#E69F00",
    "unexplained": "#D55E00",
    "total": "#555555",
}
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")

_W, _H = 640, 300
_M_LEFT, _M_RIGHT, _M_TOP, _M_BOTTOM = 64, 16, 28, 44


def _t(value: str) -> str:
    return escape(str(value), quote=True)


def _fmt(value: float) -> str:
    """Compact number formatting for axis labels and bar annotations."""
    if value == 0:
        return "0"
    a = abs(value)
    if value == int(value) and a < 1e6:
        return f"{int(value):,}"
    if a >= 1000:
        return f"{value:,.0f}"
    if a >= 100:
        return f"{value:.0f}"
    if a >= 10:
        return f"{value:.1f}"
    if a >= 1:
        return f"{value:.2f}"
    if a >= 0.01:
        return f"{value:.3f}"
    return f"{value:.2g}"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = [round(start, 12)]
    while ticks[-1] < hi - step * 1e-9:
        ticks.append(round(start + len(ticks) * step, 12))
    return ticks


def _open(title: str, width: int = _W, height: int = _H, kind: str = "plot") -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot plot-{_t(kind)}" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{_t(title)}" font-family="sans-serif" font-size="11">',
        f"<title>{_t(title)}</title>",
        f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13" '
        f'font-weight="bold">{_t(title)}</text>',
    ]


def empty_plot(title: str, reason: str) -> str:
    """A placeholder plot that states why there is nothing to draw."""
    parts = _open(title, height=80, kind="empty")
    parts.append(
        f'<text x="{_W / 2}" y="50" text-anchor="middle" fill="#777">{_t(reason)}</text></svg>'
    )
    return "\n".join(parts)


class _Axes:
    """Linear (or log10) mapping from data to pixel coordinates with drawn axes."""

    def __init__(
        self,
        x_range: tuple[float, float],
        y_range: tuple[float, float],
        width: int = _W,
        height: int = _H,
        log_x: bool = False,
    ) -> None:
        self.log_x = log_x
        self.width, self.height = width, height
        self.x0, self.x1 = _M_LEFT, width - _M_RIGHT
        self.y0, self.y1 = height - _M_BOTTOM, _M_TOP
        xl, xh = x_range
        if log_x:
            xl, xh = math.log10(max(xl, 1e-12)), math.log10(max(xh, 1e-12))
        if xh <= xl:
            xh = xl + 1.0
        self.xl, self.xh = xl, xh
        self.yticks = nice_ticks(y_range[0], y_range[1])
        self.yl, self.yh = self.yticks[0], self.yticks[-1]

    def x(self, v: float) -> float:
        if self.log_x:
            v = math.log10(max(v, 1e-12))
        return self.x0 + (v - self.xl) / (self.xh - self.xl) * (self.x1 - self.x0)

    def y(self, v: float) -> float:
        return self.y0 - (v - self.yl) / ((self.yh - self.yl) or 1.0) * (self.y0 - self.y1)

    def draw(self, xlabel: str, ylabel: str, xticks: Sequence[float] | None = None) -> list[str]:
        out = [
            f'<line x1="{self.x0}" y1="{self.y0}" x2="{self.x1}" y2="{self.y0}" stroke="#333"/>',
            f'<line x1="{self.x0}" y1="{self.y0}" x2="{self.x0}" y2="{self.y1}" stroke="#333"/>',
        ]
        for t in self.yticks:
            yy = self.y(t)
            out.append(
                f'<line x1="{self.x0}" y1="{yy:.1f}" x2="{self.x1}" y2="{yy:.1f}" stroke="#eee"/>'
                f'<text x="{self.x0 - 4}" y="{yy + 4:.1f}" text-anchor="end">{_fmt(t)}</text>'
            )
        if xticks is None:
            lo, hi = self.xl, self.xh
            xticks = [10**v for v in nice_ticks(lo, hi)] if self.log_x else nice_ticks(lo, hi)
        for t in xticks:
            xx = self.x(t)
            if self.x0 - 1 <= xx <= self.x1 + 1:
                out.append(
                    f'<text x="{xx:.1f}" y="{self.y0 + 14}" text-anchor="middle">{_fmt(t)}</text>'
                )
        out.append(
            f'<text x="{(self.x0 + self.x1) / 2}" y="{self.height - 8}" '
            f'text-anchor="middle">{_t(xlabel)}</text>'
        )
        out.append(
            f'<text x="14" y="{(self.y0 + self.y1) / 2}" text-anchor="middle" '
            f'transform="rotate(-90 14 {(self.y0 + self.y1) / 2})">{_t(ylabel)}</text>'
        )
        return out


def waterfall(
    components: Sequence[tuple[str, float, str]],
    measured_ms: float | None,
    title: str = "Decode step time: predicted components vs measured",
) -> str:
    """A waterfall of the decode step: each predicted component floats on the previous ones,
    then the predicted total, the unexplained remainder, and the measured step.

    ``components`` are (name, ms, kind) with kind fundamental | configurable. Values are also
    printed beside the bars because a 2 us component next to a 4 ms step is invisible at scale,
    and that invisibility is itself the finding.
    """
    rows: list[tuple[str, float, float, str]] = []  # label, start, end, colour kind
    acc = 0.0
    for name, ms, kind in components:
        rows.append((name, acc, acc + max(ms, 0.0), kind))
        acc += max(ms, 0.0)
    predicted = acc
    if components:
        rows.append(("predicted total", 0.0, predicted, "total"))
    if measured_ms is not None:
        rest = measured_ms - predicted
        label = "kernel inefficiency / host overhead" if rest >= 0 else "measured below predicted"
        rows.append(
            (label, min(predicted, measured_ms), max(predicted, measured_ms), "unexplained")
        )
        rows.append(("measured step", 0.0, measured_ms, "total"))
    if not rows:
        return empty_plot(title, "no step-time data")
    row_h, label_w = 24, 210
    height = _M_TOP + 16 + row_h * len(rows) + 36
    parts = _open(title, height=height, kind="waterfall")
    x0, x1 = label_w, _W - 110
    hi = max(end for _, _, end, _ in rows) or 1.0
    ticks = nice_ticks(0.0, hi)
    scale = (x1 - x0) / (ticks[-1] or 1.0)
    y = _M_TOP + 8
    for label, start, end, kind in rows:
        colour = KIND_COLOURS.get(kind, "#999")
        w = max((end - start) * scale, 1.0)
        parts.append(
            f'<text x="{x0 - 6}" y="{y + 15}" text-anchor="end">{_t(label)}</text>'
            f'<rect class="bar bar-{_t(kind)}" x="{x0 + start * scale:.1f}" y="{y + 3}" '
            f'width="{w:.1f}" height="{row_h - 6}" fill="{colour}"><title>{_t(label)}: '
            f"{_fmt(end - start)} ms</title></rect>"
            f'<text x="{x0 + end * scale + 4:.1f}" y="{y + 15}">{_fmt(end - start)} ms</text>'
        )
        y += row_h
    parts.append(f'<line x1="{x0}" y1="{y + 2}" x2="{x1}" y2="{y + 2}" stroke="#333"/>')
    for t in ticks:
        parts.append(
            f'<text x="{x0 + t * scale:.1f}" y="{y + 16}" text-anchor="middle">{_fmt(t)}</text>'
        )
    parts.append(f'<text x="{(x0 + x1) / 2}" y="{y + 30}" text-anchor="middle">ms per step</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def lines(
    series: dict[str, Sequence[tuple[float, float]]],
    title: str,
    xlabel: str,
    ylabel: str,
    log_x: bool = False,
    bands: dict[str, Sequence[tuple[float, float, float]]] | None = None,
) -> str:
    """Line chart with markers (e.g. tok/s vs concurrency); optional (x, lo, hi) CI bands."""
    pts = [p for s in series.values() for p in s]
    if not pts:
        return empty_plot(title, "no data points")
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    for band in (bands or {}).values():
        ys += [b[2] for b in band]
    ax = _Axes((min(xs), max(xs)), (0.0, max(ys) * 1.05 or 1.0), log_x=log_x)
    xticks = sorted(set(xs)) if len(set(xs)) <= 12 else None
    parts = _open(title, kind="lines") + ax.draw(xlabel, ylabel, xticks)
    for i, (name, s) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        band = (bands or {}).get(name)
        if band:
            up = " ".join(f"{ax.x(b[0]):.1f},{ax.y(b[2]):.1f}" for b in band)
            down = " ".join(f"{ax.x(b[0]):.1f},{ax.y(b[1]):.1f}" for b in reversed(band))
            parts.append(f'<polygon points="{up} {down}" fill="{colour}" fill-opacity="0.15"/>')
        s = sorted(s)
        path = " ".join(f"{ax.x(x):.1f},{ax.y(y):.1f}" for x, y in s)
        parts.append(
            f'<polyline class="series" points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>'
        )
        for x, y in s if len(s) <= 60 else []:  # dense series (telemetry): the line alone
            parts.append(
                f'<circle cx="{ax.x(x):.1f}" cy="{ax.y(y):.1f}" r="3.5" fill="{colour}">'
                f"<title>{_t(name)}: x={_fmt(x)} y={_fmt(y)}</title></circle>"
            )
        parts.append(
            f'<rect x="{ax.x0 + 10}" y="{_M_TOP + 4 + 14 * i}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{ax.x0 + 24}" y="{_M_TOP + 13 + 14 * i}">{_t(name)}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def _quantile(sorted_vals: Sequence[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    pos = q * (len(sorted_vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def histogram(values: Sequence[float], title: str, unit: str = "ms", bins: int = 30) -> str:
    """Distribution of latencies (TTFT, ITL) with p50 and p99 marked."""
    vals = sorted(v for v in values if v is not None and math.isfinite(v))
    if not vals:
        return empty_plot(title, "no samples")
    lo, hi = vals[0], vals[-1]
    if hi <= lo:
        hi = lo + (abs(lo) * 0.1 or 1.0)
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in vals:
        counts[min(int((v - lo) / width), bins - 1)] += 1
    ax = _Axes((lo, hi), (0.0, max(counts) * 1.1))
    parts = _open(title, kind="histogram") + ax.draw(f"{unit} (n={len(vals)})", "count")
    for i, c in enumerate(counts):
        if c:
            xa, xb = ax.x(lo + i * width), ax.x(lo + (i + 1) * width)
            parts.append(
                f'<rect class="bin" x="{xa:.1f}" y="{ax.y(c):.1f}" width="{max(xb - xa - 1, 1):.1f}" '
                f'height="{ax.y0 - ax.y(c):.1f}" fill="#56B4E9"><title>{_fmt(lo + i * width)}-'
                f"{_fmt(lo + (i + 1) * width)} {unit}: {c}</title></rect>"
            )
    for q, colour in ((0.5, "#0072B2"), (0.99, "#D55E00")):
        v = _quantile(vals, q)
        xx = ax.x(v)
        parts.append(
            f'<line x1="{xx:.1f}" y1="{ax.y0}" x2="{xx:.1f}" y2="{ax.y1}" stroke="{colour}" '
            f'stroke-dasharray="4 3"/><text x="{xx + 3:.1f}" y="{ax.y1 + 10}" fill="{colour}">'
            f"p{round(q * 100)} {_fmt(v)}</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts)


def bars_ci(
    items: Sequence[tuple[str, float, float | None, float | None]],
    title: str,
    unit: str,
) -> str:
    """Horizontal bars with confidence-interval whiskers (variant comparison)."""
    if not items:
        return empty_plot(title, "no variants")
    row_h, label_w = 26, 180
    height = _M_TOP + 16 + row_h * len(items) + 36
    parts = _open(title, height=height, kind="bars")
    x0, x1 = label_w, _W - 90
    hi = max(max(v, h if h is not None else v) for _, v, _, h in items) or 1.0
    ticks = nice_ticks(0.0, hi)
    scale = (x1 - x0) / (ticks[-1] or 1.0)
    y = _M_TOP + 8
    for i, (label, v, lo, h) in enumerate(items):
        colour = PALETTE[i % len(PALETTE)]
        parts.append(
            f'<text x="{x0 - 6}" y="{y + 16}" text-anchor="end">{_t(label)}</text>'
            f'<rect class="bar" x="{x0}" y="{y + 4}" width="{max(v * scale, 1):.1f}" '
            f'height="{row_h - 8}" fill="{colour}" fill-opacity="0.8"><title>{_t(label)}: '
            f"{_fmt(v)} {_t(unit)}</title></rect>"
        )
        if lo is not None and h is not None:
            ym = y + row_h / 2
            parts.append(
                f'<line class="ci" x1="{x0 + lo * scale:.1f}" y1="{ym}" x2="{x0 + h * scale:.1f}" '
                f'y2="{ym}" stroke="#000" stroke-width="1.5"/>'
                f'<line x1="{x0 + lo * scale:.1f}" y1="{ym - 5}" x2="{x0 + lo * scale:.1f}" '
                f'y2="{ym + 5}" stroke="#000"/><line x1="{x0 + h * scale:.1f}" y1="{ym - 5}" '
                f'x2="{x0 + h * scale:.1f}" y2="{ym + 5}" stroke="#000"/>'
            )
        right = max(v, h if h is not None else v)
        parts.append(f'<text x="{x0 + right * scale + 4:.1f}" y="{y + 16}">{_fmt(v)}</text>')
        y += row_h
    parts.append(f'<line x1="{x0}" y1="{y + 2}" x2="{x1}" y2="{y + 2}" stroke="#333"/>')
    for t in ticks:
        parts.append(
            f'<text x="{x0 + t * scale:.1f}" y="{y + 16}" text-anchor="middle">{_fmt(t)}</text>'
        )
    parts.append(f'<text x="{(x0 + x1) / 2}" y="{y + 30}" text-anchor="middle">{_t(unit)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)
