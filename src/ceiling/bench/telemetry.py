"""Bridge to the probe area's NVML sampler, never fatal.

NVML itself is imported lazily by ``ceiling.probe.nvml``; without NVML/GPUs (or when the sampler
fails) the result says ``{"available": false, "reason": ...}`` and the run goes on.
"""

from __future__ import annotations

from typing import Any

from ceiling.probe.telemetry import TelemetrySampler


class Telemetry:
    """Start/stop wrapper around ``ceiling.probe.telemetry.TelemetrySampler``."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self._sampler: Any = None
        self._failure: str | None = None

    def start(self) -> None:
        try:
            self._sampler = TelemetrySampler(interval_s=self.interval_s)
            self._sampler.start()
        except Exception as err:  # another area's code: record, never abort the benchmark
            self._failure = f"telemetry sampler failed to start: {type(err).__name__}: {err}"
            self._sampler = None

    def stop(self) -> dict[str, Any]:
        if self._sampler is None:
            return {"available": False, "reason": self._failure or "not started"}
        try:
            series = self._sampler.stop()
        except Exception as err:  # see start()
            return {"available": False, "reason": f"telemetry sampler failed: {err}"}
        available = bool(getattr(series, "available", False))
        out: dict[str, Any] = {"available": available, "reason": getattr(series, "reason", None)}
        if available and hasattr(series, "summary"):
            try:
                out["summary"] = series.summary()
            except Exception as err:  # see start()
                out["summary_error"] = f"{type(err).__name__}: {err}"
        return out
