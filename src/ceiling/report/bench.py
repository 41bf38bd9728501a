"""The report of a plain ``ceiling bench`` result: latency percentiles per level, the SLOs and
goodput, the capacity knee, and (HTML) the throughput/latency curve with the knee and the SLO
lines, and the TTFT and ITL distributions.

The percentiles shown are the ones the result holds (``--percentiles`` and the SLOs' own): a
report shows what was measured, never recomputes what was not kept.
"""

from __future__ import annotations

import re

import ceiling.report.plots as plots
from ceiling.bench.results import LevelResult, RunResult
from ceiling.report.extract import fmt, itl_samples_ms, table, ttft_samples_ms

LATENCY = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E"))
CURVE = "Throughput and latency"
DISTRIBUTIONS = "Latency distributions"
_PKEY = re.compile(r"^p([0-9.]+)_ttft_ms$")


def _label(lv: LevelResult) -> str:
    if lv.concurrency is not None:
        return f"c={lv.concurrency}"
    return f"{lv.request_rate:g} req/s" if lv.request_rate is not None else "-"


def _value(lv: LevelResult, key: str) -> float | None:
    v = getattr(lv, key, None)
    if v is None and lv.model_extra:
        v = lv.model_extra.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def percentiles_of(run: RunResult) -> list[str]:
    """The percentile words (``50``, ``99.9``) the result's levels hold, ascending."""
    words: set[str] = set()
    for lv in run.levels:
        keys = [*LevelResult.model_fields, *(lv.model_extra or {})]
        words.update(m[1] for k in keys if (m := _PKEY.match(k)) and _value(lv, k) is not None)
    return sorted(words, key=float)


def title(run: RunResult) -> str:
    return f"ceiling bench: {run.mode} | {run.model_id} @ {run.url}{run.endpoint}"


def _levels_table(run: RunResult) -> list[str]:
    rows = []
    for lv in run.levels:
        rows.append(
            [
                _label(lv),
                f"{lv.completed}/{lv.failed}",
                fmt(lv.request_throughput),
                fmt(lv.output_throughput, 1),
                fmt(lv.request_goodput) if lv.request_goodput is not None else "–",
            ]
        )
    heads = ["level", "ok/failed", "req/s", "output tok/s", "goodput req/s"]
    return ["## Levels", "", table(heads, rows), ""]


def _latency_tables(run: RunResult) -> list[str]:
    words = percentiles_of(run)
    out = ["## Latency percentiles per level", ""]
    for name, shown in LATENCY:
        heads = ["level", "mean", *[f"p{w}" for w in words]]
        rows = [
            [_label(lv), fmt(_value(lv, f"mean_{name}_ms"))]
            + [fmt(_value(lv, f"p{w}_{name}_ms")) for w in words]
            for lv in run.levels
        ]
        out += [f"### {shown} (ms)", "", table(heads, rows), ""]
    return out


def _slo_table(run: RunResult) -> list[str]:
    rows = [
        [_label(lv), c.slo, fmt(c.value_ms), "met" if c.met else "**missed**", c.missed_requests]
        for lv in run.levels
        for c in lv.slo
    ]
    if not rows:
        return []
    heads = ["level", "SLO", "level value ms", "level check", "requests over it"]
    return ["## SLOs", "", table(heads, rows), ""]


def _capacity(run: RunResult) -> list[str]:
    cap = run.capacity
    if cap is None:
        return []
    out = ["## Capacity", ""]
    if cap.knee_rate is None:
        out.append(f"**No rate met the SLOs** ({cap.stopped}).")
    else:
        out.append(f"**{fmt(cap.knee_rate)} req/s within the SLOs** ({cap.stopped}).")
        if cap.first_failing_rate is not None:
            out.append(
                f"\n- {fmt(cap.first_failing_rate)} req/s did not; binding SLO: "
                f"{cap.binding_slo or 'none'}"
            )
    out += [f"- Rule: {cap.level_rule}", ""]
    rows = [
        [
            fmt(p.rate),
            p.sent,
            p.good_completed,
            fmt(p.request_goodput),
            "yes" if p.passed else "no",
        ]
        for p in cap.curve
    ]
    heads = ["rate req/s", "sent", "good", "goodput req/s", "passed"]
    return [*out, table(heads, rows), ""]


def render_bench_markdown(run: RunResult) -> str:
    """The Markdown report of a bench result (every number; the plots are the HTML's)."""
    out = [f"# {title(run)}", ""]
    if run.partial:
        out += [f"> **Partial result**: {run.partial_reason}", ""]
    out += _capacity(run) + _levels_table(run) + _latency_tables(run) + _slo_table(run)
    out += [f"## {CURVE}", "", "Request throughput against p99 TTFT and ITL per level.", ""]
    out += [f"## {DISTRIBUTIONS}", "", "TTFT and ITL of every kept request.", ""]
    if run.warnings:
        out += ["## Warnings", "", *[f"- {w}" for w in run.warnings], ""]
    return "\n".join(out)


def _x(lv: LevelResult) -> float | None:
    return lv.request_throughput if lv.request_throughput is not None else lv.request_rate


def curve_series(run: RunResult, metric: str) -> dict[str, list[tuple[float, float]]]:
    """Points (request throughput, latency ms) per statistic for one metric (ttft, itl)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for word in ("50", "99"):
        key = f"p{word}_{metric}_ms"
        pts = [
            (x, v)
            for lv in run.levels
            if (x := _x(lv)) is not None and (v := _value(lv, key)) is not None
        ]
        if pts:
            out[f"p{word} {metric.upper()}"] = pts
    return out


def bench_plots(run: RunResult) -> dict[str, list[str]]:
    """SVG plots by the heading they go under."""
    knee = run.capacity.knee_rate if run.capacity is not None else None
    figures = []
    for metric in ("ttft", "itl"):
        limits = {c.slo: c.threshold_ms for lv in run.levels for c in lv.slo if c.metric == metric}
        figures.append(
            plots.curve(
                curve_series(run, metric),
                f"{metric.upper()} against request throughput",
                "request throughput, req/s",
                f"{metric.upper()} ms",
                knee=knee,
                limits=limits,
            )
        )
    ttft, itl = ttft_samples_ms(run), itl_samples_ms(run)
    dists = [plots.histogram(ttft, "TTFT distribution"), plots.histogram(itl, "ITL distribution")]
    return {CURVE: figures, DISTRIBUTIONS: dists}
