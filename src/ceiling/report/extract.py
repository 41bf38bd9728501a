"""Formatting and the samples a report needs, read out of the result nouns.

Reports render from the JSON files a user keeps (``doctor.json``, ``sweep.json``), read back
into their nouns (``ceiling.report.load_doc``), so that ``ceiling report FILE`` reproduces a
report years later and a file that no longer matches the nouns fails loudly. Pieces may be
missing (a doctor whose server died has no concurrency sweep): these helpers return None or
empty lists and the renderers say what is missing instead of failing.
"""

from __future__ import annotations

import math
from typing import Any

from ceiling.bench.results import LevelResult, RunResult
from ceiling.diagnose.measured import decode_stat, levels
from ceiling.probe.telemetry_model import TelemetrySeries

__all__ = [
    "ci_text",
    "decode_stat",
    "fmt",
    "itl_samples_ms",
    "levels",
    "num",
    "telemetry_points",
    "ttft_samples_ms",
]


def num(value: object) -> float | None:
    """A finite float, or None."""
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def fmt(value: object, digits: int = 2, unit: str = "") -> str:
    """Human formatting with a dash for unknown values."""
    f = num(value)
    if f is None:
        return "–"
    if abs(f) >= 1000:
        s = f"{f:,.0f}"
    elif abs(f) >= 100:
        s = f"{f:.0f}" if digits <= 2 else f"{f:.{digits - 2}f}"
    elif f != 0 and abs(f) < 0.01:
        s = f"{f:.2g}"
    else:
        s = f"{f:.{digits}f}"
    return f"{s} {unit}".strip() if unit else s


def ci_text(mean: object, low: object, high: object, unit: str = "", digits: int = 2) -> str:
    """'123.4 tok/s (95 % CI 120.1-126.0)' or just the mean when no interval exists."""
    if num(mean) is None:
        return "–"
    if num(low) is None or num(high) is None:
        return fmt(mean, digits, unit) + " (no CI)"
    return f"{fmt(mean, digits, unit)} (95 % CI {fmt(low, digits)}–{fmt(high, digits)})"


def _sources(run: RunResult) -> list[LevelResult]:
    """Where a run's per-request values live: its levels when present (the top level of a
    result mirrors its first level), else the run itself."""
    return list(run.levels) or [run]


def ttft_samples_ms(*runs: RunResult | None) -> list[float]:
    """Every TTFT (ms) recorded in the runs' per-request values (or detailed records)."""
    out: list[float] = []
    for run in runs:
        if run is None:
            continue
        compact = [v for lv in _sources(run) for v in lv.per_request.ttft_ms if v is not None]
        if compact:
            out += compact
            continue
        out += [
            r.ttft_ms for lv in _sources(run) for r in lv.requests or [] if r.ttft_ms is not None
        ]
    return out


def itl_samples_ms(*runs: RunResult | None) -> list[float]:
    """Every inter-token latency (ms) recorded in the runs' detailed records."""
    return [
        v
        for run in runs
        if run is not None
        for lv in _sources(run)
        for r in lv.requests or []
        for v in r.itl_ms
    ]


def telemetry_points(tel: TelemetrySeries | None, key: str) -> dict[str, list[tuple[float, float]]]:
    """Per-GPU (seconds since start, value) points of one TelemetrySample field, e.g.
    ``sm_util_pct`` or ``pcie_tx_GBps``; empty when telemetry was unavailable."""
    if tel is None or not tel.available or not tel.samples:
        return {}
    t0 = min(s.t for s in tel.samples)
    out: dict[str, list[tuple[float, float]]] = {}
    for s in tel.samples:
        v = num(getattr(s, key, None))
        if v is not None:
            out.setdefault(f"gpu{s.gpu}", []).append((s.t - t0, v))
    return out


def _cell(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub-flavoured Markdown table."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)
