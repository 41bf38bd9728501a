"""Read the numbers a report needs out of saved result documents (plain dicts).

Reports render from the JSON files a user keeps (``doctor.json``, ``sweep.json``), not from live
objects, so that ``ceiling report FILE`` reproduces a report years later. These helpers tolerate
missing pieces (a doctor whose server died has no concurrency sweep): they return None or empty
lists and the renderers say what is missing instead of failing.
"""

from __future__ import annotations

import math
from typing import Any

Doc = dict[str, Any]


def num(value: Any) -> float | None:
    """A finite float, or None."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def fmt(value: Any, digits: int = 2, unit: str = "") -> str:
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


def ci_text(mean: Any, low: Any, high: Any, unit: str = "", digits: int = 2) -> str:
    """'123.4 tok/s (95 % CI 120.1-126.0)' or just the mean when no interval exists."""
    if num(mean) is None:
        return "–"
    if num(low) is None or num(high) is None:
        return fmt(mean, digits, unit) + " (no CI)"
    return f"{fmt(mean, digits, unit)} (95 % CI {fmt(low, digits)}–{fmt(high, digits)})"


def decode_stat(run: Doc | None) -> tuple[float | None, float | None, float | None]:
    """Single-stream decode tok/s per stream with its CI across repeats (bench's ``ci``)."""
    if not run:
        return None, None, None
    mean = num(run.get("decode_tok_s_per_stream"))
    ci = (run.get("ci") or {}).get("decode_tok_s_per_stream") or {}
    if num(ci.get("mean")) is not None:
        mean = num(ci.get("mean"))
    return mean, num(ci.get("low")), num(ci.get("high"))


def concurrency_points(run: Doc | None) -> list[Doc]:
    """Per-level summaries of a concurrency sweep, sorted by concurrency."""
    if not run:
        return []
    levels = run.get("levels") or []
    out = []
    for lv in levels:
        c = num(lv.get("concurrency") or lv.get("max_concurrency"))
        if c is None:
            continue
        out.append({**lv, "concurrency": c})
    return sorted(out, key=lambda d: d["concurrency"])


def _request_lists(run: Doc) -> list[Doc]:
    """Per-request records (bench ``--save-detailed``): from the levels when present, since
    the top level of a result mirrors its first level."""
    levels = [lv for lv in run.get("levels") or [] if isinstance(lv, dict)]
    sources = levels or [run]
    return [r for src in sources for r in (src.get("requests") or []) if isinstance(r, dict)]


def ttft_samples_ms(*runs: Doc | None) -> list[float]:
    """Every TTFT (ms) recorded in the runs' per-request records or vllm-style arrays."""
    out: list[float] = []
    for run in runs:
        if not run:
            continue
        if isinstance(run.get("ttfts"), list):  # vllm bench serve --save-detailed: seconds
            out += [v * 1000.0 for v in map(num, run["ttfts"]) if v is not None]
            continue
        levels = run.get("levels") or [run]
        pr = [lv.get("per_request") or {} for lv in levels]
        if any(p.get("ttft_ms") for p in pr):  # ceiling bench: compact per-request values
            out += [v for p in pr for v in map(num, p.get("ttft_ms") or []) if v is not None]
            continue
        for r in _request_lists(run):
            v = num(r.get("ttft_ms"))
            if v is None and num(r.get("ttft")) is not None:
                v = num(r.get("ttft")) * 1000.0  # type: ignore[operator]
            if v is not None:
                out.append(v)
    return out


def itl_samples_ms(*runs: Doc | None) -> list[float]:
    """Every inter-token latency (ms) recorded in the runs."""
    out: list[float] = []
    for run in runs:
        if not run:
            continue
        if isinstance(run.get("itls"), list):  # seconds, one list per request
            for lst in run["itls"]:
                out += [v * 1000.0 for v in map(num, lst or []) if v is not None]
            continue
        for r in _request_lists(run):
            if isinstance(r.get("itl_ms"), list):
                out += [v for v in map(num, r["itl_ms"]) if v is not None]
            elif isinstance(r.get("itl"), list):
                out += [v * 1000.0 for v in map(num, r["itl"]) if v is not None]
    return out


def telemetry_points(tel: Doc | None, key: str) -> dict[str, list[tuple[float, float]]]:
    """Per-GPU (seconds since start, value) points of one TelemetrySample field, e.g.
    ``sm_util_pct`` or ``pcie_tx_GBps``; empty when telemetry was unavailable."""
    if not tel or not tel.get("available") or not tel.get("samples"):
        return {}
    samples = tel["samples"]
    t0 = min(num(s.get("t")) or 0.0 for s in samples)
    out: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        v, t = num(s.get(key)), num(s.get("t"))
        if v is not None and t is not None:
            out.setdefault(f"gpu{s.get('gpu', 0)}", []).append((t - t0, v))
    return out
