"""Server-side latencies from Prometheus ``/metrics``: histogram deltas over the measured run.

We scrape before and after each measurement and divide the deltas of ``_sum`` by ``_count``:
the server's own mean TTFT, inter-token latency, queue time and end-to-end latency for exactly
the requests of the run (if nobody else used the server meanwhile). Set beside the client's
numbers, the difference is the client + network + HTTP/SSE framing overhead.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ceiling.engines import all_engines


@cache
def histograms() -> dict[str, tuple[str, ...]]:
    """Quantity -> histogram names to try: every engine's, in registration order (vLLM, SGLang).

    Each engine adapter lists its own names, newest first (``metric_histograms``).
    """
    out: dict[str, tuple[str, ...]] = {}
    for engine in all_engines():
        for quantity, names in engine.metric_histograms.items():
            out[quantity] = out.get(quantity, ()) + tuple(names)
    return out


@cache
def counters() -> dict[str, tuple[str, ...]]:
    """Quantity -> counter names to try (``preemptions``...): every engine's ``metric_counters``."""
    out: dict[str, tuple[str, ...]] = {}
    for engine in all_engines():
        for quantity, names in engine.metric_counters.items():
            out[quantity] = out.get(quantity, ()) + tuple(names)
    return out


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum every sample of the text by sample name (labels merged: all models, all ranks).

    Parsed by ``prometheus_client``'s own text parser. A scrape with a malformed line (a proxy's
    error page glued on, a truncated body) is parsed line by line instead, so the bad line alone
    is dropped, not the whole scrape; NaN samples (an empty summary) are skipped.
    """
    totals: dict[str, float] = {}

    def add(chunk: str) -> None:
        for family in text_string_to_metric_families(chunk):
            for sample in family.samples:
                if not math.isnan(sample.value):
                    totals[sample.name] = totals.get(sample.name, 0.0) + sample.value

    try:
        add(text)
    except ValueError:
        totals.clear()
        for line in text.splitlines():
            if line.strip() and not line.startswith("#"):
                try:
                    add(line + "\n")
                except ValueError:
                    continue
    return totals


def engine_of(totals: dict[str, float]) -> str | None:
    """Which engine's names the scrape uses (``vllm``, ``sglang``) or None."""
    for engine in all_engines():
        prefix = engine.metric_prefix
        if prefix and any(k.startswith(prefix) for k in totals):
            return engine.name
    return None


def delta(before: str | None, after: str | None) -> dict[str, float] | None:
    """After minus before, per metric name (None when either scrape is missing)."""
    if before is None or after is None:
        return None
    b, a = parse_prometheus(before), parse_prometheus(after)
    return {k: v - b.get(k, 0.0) for k, v in a.items()}


def add_deltas(
    total: dict[str, float] | None, d: dict[str, float] | None
) -> dict[str, float] | None:
    """Sum two deltas (repeats of one level); None stays None (a scrape failed once)."""
    if total is None or d is None:
        return None
    out = dict(total)
    for k, v in d.items():
        out[k] = out.get(k, 0.0) + v
    return out


def histogram_means_ms(d: dict[str, float]) -> dict[str, Any]:
    """Per quantity: mean over the interval in ms and the number of observations."""
    out: dict[str, Any] = {}
    for quantity, names in histograms().items():
        for name in names:
            ds, dc = d.get(name + "_sum"), d.get(name + "_count")
            if ds is None or dc is None:
                continue
            out[quantity] = {
                "metric": name,
                "count": dc,
                "mean_ms": ds / dc * 1000.0 if dc > 0 else None,
            }
            break
    return out


def compare_to_client(
    d: dict[str, float] | None, client: dict[str, float | None], missing: str | None = None
) -> dict[str, Any]:
    """Server means beside the client's and their difference (client minus server, ms).

    ``d`` is the summed delta of the scrapes; ``client`` has ``ttft``, ``itl`` (token-weighted
    TPOT: comparable to a per-token server histogram), ``e2el`` means in ms; ``missing`` says
    why a delta is absent when the endpoint exists (the run stopped, the server died).
    """
    if d is None:
        return {
            "available": False,
            "reason": missing or "no /metrics endpoint (or it did not answer)",
        }
    means = histogram_means_ms(d)
    counted = {}
    for quantity, names in counters().items():
        name = next((n for n in names if n in d), None)
        if name is not None:
            counted[quantity] = {"metric": name, "delta": d[name]}
    if not means and not counted:
        return {"available": False, "reason": "/metrics has no known latency histograms"}
    # an engine with counters and no histograms (llama-server: decode calls, tokens and
    # seconds predicted) still reports what its counters say
    rows: dict[str, Any] = {}
    for quantity, info in means.items():
        row = dict(info)
        row["server_mean_ms"] = row.pop("mean_ms")
        c = client.get(quantity)
        if c is not None:
            row["client_mean_ms"] = c
            if row["server_mean_ms"] is not None:
                row["overhead_ms"] = c - row["server_mean_ms"]
        rows[quantity] = row
    return {"available": True, "engine": engine_of(d), "quantities": rows, "counters": counted}
