"""Telemetry nouns (a sample, a series and its summary), apart from the NVML sampler that
records them (``telemetry.py``), so that a pure reader (``ceiling.diagnose``) can hold a series
without importing NVML."""

from __future__ import annotations

import statistics
from typing import Any

from pydantic import BaseModel, Field

SCHEMA_VERSION = 1
# Share of the link's per-direction bandwidth under which traffic is "latency-bound" and over
# which it is "bandwidth-bound" (judgement thresholds for the summary sentence, not hardware).
LATENCY_BOUND_BELOW = 0.10
BANDWIDTH_BOUND_ABOVE = 0.60


class TelemetrySample(BaseModel):
    """One reading of one GPU. ``t`` is epoch seconds (align it with request timestamps)."""

    t: float
    gpu: int
    pcie_tx_GBps: float | None = None
    pcie_rx_GBps: float | None = None
    sm_util_pct: float | None = None
    mem_util_pct: float | None = None
    sm_clock_MHz: float | None = None
    mem_clock_MHz: float | None = None
    power_W: float | None = None
    temp_C: float | None = None


class GpuLink(BaseModel):
    index: int
    name: str
    pcie_gen: int | None = None
    pcie_width: int | None = None
    link_GBps: float | None = Field(None, description="PCIe per-direction link bandwidth")


class TelemetrySeries(BaseModel):
    """What a sampler recorded: the time series plus what is needed to summarise it."""

    schema_version: int = SCHEMA_VERSION
    available: bool
    reason: str | None = None
    interval_s: float
    pcie_method: str | None = Field(None, description="counters | throughput | None")
    started: float | None = None
    stopped: float | None = None
    gpus: list[GpuLink] = Field(default_factory=list)
    samples: list[TelemetrySample] = Field(default_factory=list)

    def summary(
        self, start: float | None = None, end: float | None = None, label: str = "the run"
    ) -> dict[str, Any]:
        """Per-GPU means (and p95 of PCIe), link share, and one sentence of verdict.

        ``start``/``end`` (epoch seconds) restrict it to a window, e.g. the decode phase.
        """
        out: dict[str, Any] = {
            "available": self.available,
            "reason": self.reason,
            "interval_s": self.interval_s,
            "duration_s": None,
            "n_samples": 0,
            "gpus": [],
            "verdict": None,
        }
        if not self.available:
            out["verdict"] = f"no telemetry: {self.reason}"
            return out
        rows = [
            s
            for s in self.samples
            if (start is None or s.t >= start) and (end is None or s.t <= end)
        ]
        out["n_samples"] = len(rows)
        if rows:
            out["duration_s"] = round(max(s.t for s in rows) - min(s.t for s in rows), 3)
        shares = []
        for g in self.gpus:
            mine = [s for s in rows if s.gpu == g.index]
            d: dict[str, Any] = {"index": g.index, "name": g.name, "link_GBps": g.link_GBps}
            for key in (
                "pcie_tx_GBps",
                "pcie_rx_GBps",
                "sm_util_pct",
                "mem_util_pct",
                "sm_clock_MHz",
                "mem_clock_MHz",
                "power_W",
                "temp_C",
            ):
                vals = [getattr(s, key) for s in mine if getattr(s, key) is not None]
                d[f"{key}_mean"] = round(statistics.fmean(vals), 3) if vals else None
                if key.startswith("pcie"):
                    d[f"{key}_p95"] = round(_pct(vals, 0.95), 3) if vals else None
                if key in ("power_W", "temp_C"):
                    d[f"{key}_max"] = round(max(vals), 1) if vals else None
            busiest = max(
                (v for v in (d["pcie_tx_GBps_mean"], d["pcie_rx_GBps_mean"]) if v is not None),
                default=None,
            )
            d["link_share_pct"] = (
                round(100 * busiest / g.link_GBps, 2)
                if busiest is not None and g.link_GBps
                else None
            )
            if busiest is not None and d["link_share_pct"] is not None:
                shares.append((busiest, d["link_share_pct"]))
            out["gpus"].append(d)
        out["verdict"] = _verdict(shares, label)
        return out


def _pct(vals: list[float], q: float) -> float:
    s = sorted(vals)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def _verdict(shares: list[tuple[float, float]], label: str) -> str:
    if not shares:
        return f"PCIe traffic during {label}: not measured (no PCIe counters or link width)"
    gbps = statistics.fmean(b for b, _ in shares)
    pct = max(p for _, p in shares)
    if pct / 100 < LATENCY_BOUND_BELOW:
        kind = "latency-bound, not bandwidth-bound"
    elif pct / 100 > BANDWIDTH_BOUND_ABOVE:
        kind = "bandwidth-bound: the link is busy"
    else:
        kind = "partly bandwidth-bound"
    return (
        f"PCIe traffic during {label}: {gbps:.2f} GB/s per GPU = {pct:.1f} % of the link "
        f"(busiest GPU): {kind}"
    )
