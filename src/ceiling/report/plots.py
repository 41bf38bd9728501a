"""Inline SVG plots for the reports, drawn by matplotlib's SVG backend.

The HTML report must be one self-contained file that opens anywhere without network access or
JavaScript, so every function returns an ``<svg>`` string ready to inline: matplotlib draws the
figure (``Figure.savefig(format="svg")``: the vector backend, no Agg raster, no pyplot and no
global figure state), text stays text (``svg.fonttype: none``: searchable, small), and
:func:`_inline_svg` turns the standalone document into an element of the page: a root with
``class="plot plot-<kind>"``, ``role="img"`` and a ``<title>`` for accessibility, ids prefixed
per plot so that several plots in one page never share an id, no XML prolog or metadata.
An empty-state plot says what is missing, so a report never breaks on absent data.

matplotlib is imported inside the functions: it costs ~0.5-1 s, and only report rendering
needs it (``ceiling --help`` and ``ceiling predict`` must start fast).
"""

from __future__ import annotations

import hashlib
import io
import math
import re
from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.typing import RcKeyType

# Colour per attribution kind and a palette for series (colour-blind safe: Okabe-Ito).
KIND_COLOURS = {
    "fundamental": "#0072B2",
    "configurable": "#E69F00",
    "unexplained": "#D55E00",
    "total": "#555555",
}
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")

_W, _H = 640, 300  # CSS pixels; matplotlib's SVG user unit is the point (72 per inch)
_RC: dict[RcKeyType, Any] = {
    "svg.fonttype": "none",  # <text> elements, not glyph outlines
    "svg.hashsalt": "ceiling",  # deterministic clip-path/marker ids (and so output)
    "text.parse_math": False,  # a '$' in a variant name is a dollar sign, not TeX
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica"],
    "font.size": 10,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#eeeeee",
    "axes.axisbelow": True,
    "legend.frameon": False,
}
_META = {"Date": None, "Creator": None, "Format": None, "Type": None}  # no <metadata> block


def _fmt(value: float) -> str:
    """Compact number formatting for bar annotations and quantile labels."""
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


def _figure(height: float = _H) -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(_W / 72, height / 72), layout="constrained")
    return fig, fig.add_subplot()


def _inline_svg(fig: Figure, kind: str, title: str) -> str:
    """matplotlib's SVG document -> an inline ``<svg class="plot plot-<kind>">`` element."""
    import matplotlib as mpl

    buf = io.StringIO()
    with mpl.rc_context(_RC):
        fig.savefig(buf, format="svg", metadata=_META)
    doc = buf.getvalue()
    head = re.search(r"<svg\b[^>]*>", doc)
    if head is None:  # pragma: no cover - matplotlib always writes a root element
        raise RuntimeError("matplotlib wrote no <svg> element")
    box = re.search(r'viewBox="([^"]+)"', head.group(0))
    w, h = box.group(1).split()[2:] if box else (str(_W), str(_H))
    body = doc[head.end() :]
    # Unique ids per plot: many plots share one HTML page, and matplotlib numbers from 1.
    pre = f"{kind}-{hashlib.sha1((title + body).encode()).hexdigest()[:8]}-"

    def tag(m: re.Match[str]) -> str:  # inside tags only: text content stays as written
        t = re.sub(r'(\s)id="([^"]+)"', rf'\1id="{pre}\2"', m.group(0))
        t = re.sub(r"url\(#([^)]+)\)", rf"url(#{pre}\1)", t)
        return re.sub(r'xlink:href="#([^"]+)"', rf'href="#{pre}\1"', t)  # SVG 2 href

    body = re.sub(r"<[^>]+>", tag, body)
    t = escape(title, quote=True)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot plot-{escape(kind)}" '
        f'viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{t}">\n'
        f"<title>{t}</title>{body}"
    )


def _render(kind: str, title: str, draw: Callable[[Axes], None], height: float = _H) -> str:
    import matplotlib as mpl

    with mpl.rc_context(_RC):
        fig, ax = _figure(height)
        ax.set_title(title)
        draw(ax)
    return _inline_svg(fig, kind, title)


def empty_plot(title: str, reason: str) -> str:
    """A placeholder plot that states why there is nothing to draw."""

    def draw(ax: Axes) -> None:
        ax.set_axis_off()
        ax.text(0.5, 0.4, reason, ha="center", va="center", color="#777777", transform=ax.transAxes)

    return _render("empty", title, draw, height=80)


def waterfall_rows(
    components: Sequence[tuple[str, float, str]], measured_ms: float | None
) -> list[tuple[str, float, float, str]]:
    """(label, start, end, kind) rows: each predicted component floats on the previous ones,
    then the predicted total, the unexplained remainder, and the measured step."""
    rows: list[tuple[str, float, float, str]] = []
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
    return rows


def waterfall(
    components: Sequence[tuple[str, float, str]],
    measured_ms: float | None,
    title: str = "Decode step time: predicted components vs measured",
) -> str:
    """A waterfall of the decode step (rows from :func:`waterfall_rows`).

    ``components`` are (name, ms, kind) with kind fundamental | configurable. Values are also
    printed beside the bars because a 2 us component next to a 4 ms step is invisible at scale,
    and that invisibility is itself the finding.
    """
    rows = waterfall_rows(components, measured_ms)
    if not rows:
        return empty_plot(title, "no step-time data")

    def draw(ax: Axes) -> None:
        ys = range(len(rows))
        widths = [end - start for _, start, end, _ in rows]
        bars = ax.barh(
            ys,
            widths,
            left=[start for _, start, _, _ in rows],
            height=0.7,
            color=[KIND_COLOURS.get(kind, "#999999") for *_, kind in rows],
        )
        for i, (patch, (_, _, _, kind)) in enumerate(zip(bars.patches, rows, strict=True)):
            patch.set_gid(f"bar-{kind}-{i}")
        ax.bar_label(bars, labels=[f"{_fmt(w)} ms" for w in widths], padding=3)
        ax.set_yticks(list(ys), [label for label, *_ in rows])
        ax.invert_yaxis()  # first component on top
        ax.set_xlabel("ms per step")
        ax.set_xlim(0, max(end for _, _, end, _ in rows) * 1.18 or 1.0)
        ax.grid(axis="y", visible=False)

    return _render("waterfall", title, draw, height=60 + 24 * len(rows))


def lines(
    series: Mapping[str, Sequence[tuple[float, float]]],
    title: str,
    xlabel: str,
    ylabel: str,
    log_x: bool = False,
    bands: Mapping[str, Sequence[tuple[float, float, float]]] | None = None,
) -> str:
    """Line chart with markers (e.g. tok/s vs concurrency); optional (x, lo, hi) CI bands."""
    if not any(series.values()):
        return empty_plot(title, "no data points")
    xs = sorted({p[0] for s in series.values() for p in s})

    def draw(ax: Axes) -> None:
        for i, (name, s) in enumerate(series.items()):
            colour = PALETTE[i % len(PALETTE)]
            band = sorted((bands or {}).get(name) or [])
            if band:
                ax.fill_between(
                    [b[0] for b in band],
                    [b[1] for b in band],
                    [b[2] for b in band],
                    color=colour,
                    alpha=0.15,
                    linewidth=0,
                )
            pts = sorted(s)
            dense = len(pts) > 60  # telemetry: the line alone
            (line,) = ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                color=colour,
                linewidth=2,
                marker=None if dense else "o",
                markersize=5,
                label=name,
            )
            line.set_gid(f"series-{i}")
        if log_x:
            ax.set_xscale("log")
        if len(xs) <= 12:
            ax.set_xticks(xs, [_fmt(x) for x in xs])
        ax.set_ylim(bottom=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(loc="best")  # away from the data

    return _render("lines", title, draw)


def curve(
    series: Mapping[str, Sequence[tuple[float, float]]],
    title: str,
    xlabel: str,
    ylabel: str,
    knee: float | None = None,
    limits: Mapping[str, float] | None = None,
) -> str:
    """Latency against throughput, one line per statistic, with the capacity knee (a vertical
    line at its rate) and each SLO's threshold (a horizontal line, labelled)."""
    if not any(series.values()):
        return empty_plot(title, "no data points")

    def draw(ax: Axes) -> None:
        for i, (name, pts) in enumerate(series.items()):
            xy = sorted(pts)
            ax.plot(
                [p[0] for p in xy],
                [p[1] for p in xy],
                color=PALETTE[i % len(PALETTE)],
                linewidth=2,
                marker="o",
                markersize=5,
                label=name,
            )
        for j, (name, v) in enumerate((limits or {}).items()):
            ax.axhline(v, color=PALETTE[5 + j % 3], linestyle="--", linewidth=1, label=name)
        if knee is not None:
            ax.axvline(
                knee,
                color="#000000",
                linestyle=":",
                linewidth=1.5,
                label=f"knee {_fmt(knee)} req/s",
            )
        ax.set_ylim(bottom=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(loc="best")

    return _render("curve", title, draw)


def histogram(values: Sequence[float], title: str, unit: str = "ms", bins: int = 30) -> str:
    """Distribution of latencies (TTFT, ITL) with p50 and p99 marked."""
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    vals = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if len(vals) == 0:
        return empty_plot(title, "no samples")
    lo, hi = float(vals.min()), float(vals.max())
    if hi <= lo:
        hi = lo + (abs(lo) * 0.1 or 1.0)

    def draw(ax: Axes) -> None:
        ax.hist(vals, bins=bins, range=(lo, hi), color="#56B4E9", rwidth=0.92)
        for i, patch in enumerate(ax.patches):  # the bins: the only patches of the axes
            patch.set_gid(f"bin-{i}")
        for q, colour in ((50, "#0072B2"), (99, "#D55E00")):
            v = float(np.percentile(vals, q))
            ax.axvline(v, color=colour, linestyle="--", linewidth=1)
            ax.annotate(
                f"p{q} {_fmt(v)}",
                (v, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, -10),
                textcoords="offset points",
                color=colour,
            )
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts
        ax.set_xlabel(f"{unit} (n={len(vals)})")
        ax.set_ylabel("count")

    return _render("histogram", title, draw)


def bars_ci(
    items: Sequence[tuple[str, float, float | None, float | None]],
    title: str,
    unit: str,
) -> str:
    """Horizontal bars with confidence-interval whiskers (variant comparison)."""
    if not items:
        return empty_plot(title, "no variants")

    def draw(ax: Axes) -> None:
        ys = list(range(len(items)))
        bars = ax.barh(
            ys,
            [v for _, v, _, _ in items],
            height=0.6,
            color=[PALETTE[i % len(PALETTE)] for i in ys],
            alpha=0.8,
        )
        for i, patch in enumerate(bars.patches):
            patch.set_gid(f"bar-{i}")
        for y, (_, v, lo, hi) in zip(ys, items, strict=True):
            if lo is not None and hi is not None:
                ax.errorbar(
                    v,
                    y,
                    xerr=[[max(v - lo, 0.0)], [max(hi - v, 0.0)]],
                    color="#000000",
                    capsize=5,
                    linewidth=1.5,
                    gid=f"ci-{y}",
                )
            right = max(v, hi if hi is not None else v)
            ax.annotate(_fmt(v), (right, y), xytext=(4, 0), textcoords="offset points", va="center")
        ax.set_yticks(ys, [label for label, *_ in items])
        ax.invert_yaxis()
        hi_all = max(max(v, h if h is not None else v) for _, v, _, h in items)
        ax.set_xlim(0, hi_all * 1.15 or 1.0)
        ax.set_xlabel(unit)
        ax.grid(axis="y", visible=False)

    return _render("bars", title, draw, height=70 + 26 * len(items))


def stacked_step(
    bars: Sequence[tuple[str, Sequence[tuple[str, float]]]],
    title: str = "Decode step by op class: measured (engine trace) vs predicted",
) -> str:
    """Horizontal stacked bars, one per row (``(label, [(class, ms), ...])``): the measured
    step by op class beside predict's expected and bound for the same classes. One colour per
    class across the rows; idle is grey."""
    rows = [(label, [(c, ms) for c, ms in parts if ms > 0]) for label, parts in bars]
    rows = [r for r in rows if r[1]]
    if not rows:
        return empty_plot(title, "no step-time data")
    names: list[str] = []
    for _, parts in rows:
        names += [c for c, _ in parts if c not in names]
    colour = {
        c: ("#bbbbbb" if c == "idle" else PALETTE[i % len(PALETTE)]) for i, c in enumerate(names)
    }

    def draw(ax: Axes) -> None:
        for y, (_, parts) in enumerate(rows):
            left = 0.0
            for c, ms in parts:
                ax.barh(
                    y,
                    ms,
                    left=left,
                    height=0.6,
                    color=colour[c],
                    label=c if y == 0 or c not in [p for p, _ in rows[0][1]] else None,
                )
                left += ms
            ax.text(left, y, f" {_fmt(left)} ms", va="center")
        ax.set_yticks(list(range(len(rows))), [label for label, _ in rows])
        ax.invert_yaxis()
        ax.set_xlabel("ms per step")
        total = max(sum(ms for _, ms in parts) for _, parts in rows)
        ax.set_xlim(0, total * 1.2 or 1.0)
        ax.grid(axis="y", visible=False)
        handles, labels = ax.get_legend_handles_labels()
        seen: dict[str, Any] = {}
        for h, lab in zip(handles, labels, strict=True):
            seen.setdefault(lab, h)
        ax.legend(
            list(seen.values()),
            list(seen),
            loc="upper center",
            ncols=min(len(seen), 5),
            bbox_to_anchor=(0.5, -0.25),
            fontsize=8,
        )

    return _render("stacked-step", title, draw, height=150 + 30 * len(rows))
