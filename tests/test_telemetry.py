"""Telemetry sampler: the NVML-absent path never raises; with a fake NVML the series and the
summary (GB/s from counter deltas, share of the link, verdict) follow the counters."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from ceiling.probe import nvml
from ceiling.probe.telemetry import TelemetrySampler, TelemetrySeries, record


@pytest.fixture(autouse=True)
def _fresh_nvml():
    nvml.reset_for_tests()
    yield
    nvml.reset_for_tests()


def test_without_nvml_the_sampler_reports_why_and_never_raises(monkeypatch):
    monkeypatch.setattr(nvml, "open_nvml", lambda: (None, "no driver (test)"))
    with TelemetrySampler(0.01) as s:
        time.sleep(0.02)
    series = s.series
    assert isinstance(series, TelemetrySeries)
    assert series.available is False and series.reason == "no driver (test)"
    assert series.samples == []
    summary = series.summary()
    assert summary["available"] is False
    assert "no telemetry" in summary["verdict"]


def test_record_returns_at_once_without_nvml(monkeypatch):
    monkeypatch.setattr(nvml, "open_nvml", lambda: (None, "absent"))
    t0 = time.monotonic()
    series = record(5.0)
    assert time.monotonic() - t0 < 1.0
    assert not series.available


class FakeNVML:
    """One Gen5 x16 GPU whose PCIe counters grow at ``rate`` bytes/s (TX) and rate/2 (RX)."""

    NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 196, 197
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1

    def __init__(self, rate: float, counters: bool = True) -> None:
        self.rate, self.counters, self.t0 = rate, counters, time.time()

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H200"

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 1  # idle GPUs train down: the share must use the max generation

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetFieldValues(self, h, ids):
        if not self.counters:
            raise RuntimeError("Not Supported")
        el = time.time() - self.t0
        vals = {196: int(self.rate * el), 197: int(self.rate / 2 * el)}
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(ullVal=vals[i])) for i in ids]

    def nvmlDeviceGetPcieThroughput(self, h, which):
        return self.rate / 1e3 if which == 0 else self.rate / 2e3  # KB/s

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=90, memory=80)

    def nvmlDeviceGetPowerUsage(self, h):
        return 400_000  # mW

    def nvmlDeviceGetClockInfo(self, h, which):
        return 1980 if which == 1 else 3201

    def nvmlDeviceGetTemperature(self, h, which):
        return 55


@pytest.mark.parametrize("counters", [True, False])
def test_summary_follows_the_counters(monkeypatch, counters):
    fake = FakeNVML(rate=0.5e9, counters=counters)  # 0.5 GB/s of a 63 GB/s link
    monkeypatch.setattr(nvml, "open_nvml", lambda: (fake, None))
    series = record(0.3, 0.02)
    assert series.available and series.pcie_method == ("counters" if counters else "throughput")
    assert len(series.samples) >= 5
    assert series.gpus[0].link_GBps == pytest.approx(63.02, abs=0.01)
    s = series.summary(label="decode")
    g = s["gpus"][0]
    assert g["pcie_tx_GBps_mean"] == pytest.approx(0.5, rel=0.15)
    assert g["pcie_rx_GBps_mean"] == pytest.approx(0.25, rel=0.15)
    assert g["link_share_pct"] == pytest.approx(100 * 0.5 / 63.02, rel=0.15)
    assert g["power_W_mean"] == 400 and g["sm_clock_MHz_mean"] == 1980 and g["temp_C_max"] == 55
    assert s["verdict"].startswith("PCIe traffic during decode: 0.5")
    assert "latency-bound, not bandwidth-bound" in s["verdict"]


def test_busy_link_is_called_bandwidth_bound(monkeypatch):
    monkeypatch.setattr(nvml, "open_nvml", lambda: (FakeNVML(rate=50e9), None))
    s = record(0.2, 0.02).summary()
    assert "bandwidth-bound: the link is busy" in s["verdict"]


def test_window_restricts_the_summary(monkeypatch):
    monkeypatch.setattr(nvml, "open_nvml", lambda: (FakeNVML(rate=1e9), None))
    series = record(0.2, 0.02)
    mid = series.samples[len(series.samples) // 2].t
    assert 0 < series.summary(start=mid)["n_samples"] < len(series.samples)
    assert series.summary(start=series.stopped + 1)["n_samples"] == 0


def test_a_failing_query_stops_sampling_without_raising(monkeypatch):
    monkeypatch.setattr(nvml, "open_nvml", lambda: (FakeNVML(rate=1e9), None))
    sampler = TelemetrySampler(0.01).start()
    time.sleep(0.05)

    def broken(*_a, **_k):
        raise ValueError("driver went away")

    monkeypatch.setattr(nvml, "call", broken)  # every later query raises
    time.sleep(0.05)
    series = sampler.stop()
    assert series.available and series.samples
    assert series.reason and "driver went away" in series.reason
