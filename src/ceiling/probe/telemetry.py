"""NVML telemetry sampled in a background thread while something else runs (``bench
--telemetry``, ``ceiling telemetry``).

Why: the decode allreduces of a TP deployment move kilobytes per layer. Whether the PCIe or
NVLink link is *busy* (bandwidth-bound) or idle between tiny messages (latency-bound) decides
which fix can help, and NVML's PCIe counters answer that directly. Clocks, power and temperature
catch the other usual suspect: a throttled or idle-clocked GPU.

PCIe bytes come from NVML's cumulative counters (``NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES``) when
the driver has them, else from ``nvmlDeviceGetPcieThroughput`` (a 20 ms window per query, which
limits how fast many GPUs can be sampled). Without NVML the sampler records nothing and says why;
it never raises for that.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ceiling.probe import nvml
from ceiling.probe.telemetry_model import (  # noqa: F401  (the nouns, re-exported)
    SCHEMA_VERSION,
    GpuLink,
    TelemetrySample,
    TelemetrySeries,
)
from ceiling.probe.topology import pcie_GBps


class TelemetrySampler:
    """Sample every GPU every ``interval_s`` seconds in a daemon thread.

    ``start()`` / ``stop() -> TelemetrySeries``, or ``with TelemetrySampler() as s: ...`` and then
    ``s.series``. Intervals are clamped to 10-1000 ms.
    """

    def __init__(self, interval_s: float = 0.05, gpus: list[int] | None = None) -> None:
        self.interval_s = min(max(interval_s, 0.01), 1.0)
        self._want = gpus
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._samples: list[TelemetrySample] = []
        self._handles: list[tuple[int, Any]] = []
        self._prev: dict[int, tuple[float, int, int]] = {}
        self.series: TelemetrySeries | None = None
        self._p: Any = None
        self._reason: str | None = None
        self._method: str | None = None
        self._links: list[GpuLink] = []
        self._t0: float | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> TelemetrySampler:
        p, why = nvml.open_nvml()
        self._t0 = time.time()
        if p is None:
            self._reason = why
            return self
        self._p = p
        self._setup()
        if not self._handles:
            self._reason = "NVML sees no GPU"
            return self
        self._thread = threading.Thread(target=self._loop, name="ceiling-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> TelemetrySeries:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.series = TelemetrySeries(
            available=self._p is not None and bool(self._handles),
            reason=self._reason,
            interval_s=self.interval_s,
            pcie_method=self._method,
            started=self._t0,
            stopped=time.time(),
            gpus=self._links,
            samples=list(self._samples),
        )
        return self.series

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def _setup(self) -> None:
        p, c = self._p, nvml.call
        count = c(p.nvmlDeviceGetCount, default=0)
        for i in range(count):
            if self._want is not None and i not in self._want:
                continue
            h = c(p.nvmlDeviceGetHandleByIndex, i)
            if h is None:
                continue
            self._handles.append((i, h))
            gen = c(p.nvmlDeviceGetCurrPcieLinkGeneration, h)
            gen_max = c(p.nvmlDeviceGetMaxPcieLinkGeneration, h)
            width = c(p.nvmlDeviceGetCurrPcieLinkWidth, h)
            # An idle GPU trains its link down (Gen1); judge the share against the max gen.
            self._links.append(
                GpuLink(
                    index=i,
                    name=nvml.text(c(p.nvmlDeviceGetName, h, default="unknown")),
                    pcie_gen=gen,
                    pcie_width=width,
                    link_GBps=pcie_GBps(gen_max or gen, width),
                )
            )
        if self._handles:
            first = self._handles[0][1]
            self._method = "counters" if self._counters(first) is not None else "throughput"

    def _counters(self, h: Any) -> tuple[int, int] | None:
        p = self._p
        try:
            vals = p.nvmlDeviceGetFieldValues(
                h, [p.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, p.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
            )
        except Exception:
            return None
        if any(v.nvmlReturn != 0 for v in vals):
            return None
        return int(vals[0].value.ullVal), int(vals[1].value.ullVal)

    def _loop(self) -> None:
        while not self._stop.is_set():
            t_next = time.monotonic() + self.interval_s
            for i, h in self._handles:
                try:
                    self._samples.append(self._read(i, h))
                except Exception as exc:  # a sampler must never kill the run it watches
                    self._reason = f"sampling stopped: {exc}"
                    return
            self._stop.wait(max(0.0, t_next - time.monotonic()))

    def _read(self, i: int, h: Any) -> TelemetrySample:
        p, c = self._p, nvml.call
        now = time.time()
        tx = rx = None
        if self._method == "counters":
            cnt = self._counters(h)
            if cnt is not None:
                prev = self._prev.get(i)
                self._prev[i] = (now, *cnt)
                if prev is not None and now > prev[0] and cnt[0] >= prev[1] and cnt[1] >= prev[2]:
                    dt = now - prev[0]
                    tx, rx = (cnt[0] - prev[1]) / dt / 1e9, (cnt[1] - prev[2]) / dt / 1e9
        else:
            t = c(p.nvmlDeviceGetPcieThroughput, h, p.NVML_PCIE_UTIL_TX_BYTES)
            r = c(p.nvmlDeviceGetPcieThroughput, h, p.NVML_PCIE_UTIL_RX_BYTES)
            tx = None if t is None else t * 1e3 / 1e9  # KB/s -> GB/s
            rx = None if r is None else r * 1e3 / 1e9
        util = c(p.nvmlDeviceGetUtilizationRates, h)
        power = c(p.nvmlDeviceGetPowerUsage, h)
        return TelemetrySample(
            t=now,
            gpu=i,
            pcie_tx_GBps=tx,
            pcie_rx_GBps=rx,
            sm_util_pct=None if util is None else float(util.gpu),
            mem_util_pct=None if util is None else float(util.memory),
            sm_clock_MHz=c(p.nvmlDeviceGetClockInfo, h, p.NVML_CLOCK_SM),
            mem_clock_MHz=c(p.nvmlDeviceGetClockInfo, h, p.NVML_CLOCK_MEM),
            power_W=None if power is None else power / 1000,
            temp_C=c(p.nvmlDeviceGetTemperature, h, p.NVML_TEMPERATURE_GPU),
        )


def record(duration_s: float, interval_s: float = 0.05) -> TelemetrySeries:
    """Sample for ``duration_s`` seconds (``ceiling telemetry``)."""
    sampler = TelemetrySampler(interval_s).start()
    try:
        if sampler.running:
            time.sleep(max(0.0, duration_s))
    finally:
        series = sampler.stop()
    return series
