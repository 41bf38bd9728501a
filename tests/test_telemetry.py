"""Telemetry sampler: the NVML-absent path never raises; with a fake NVML the series and the
summary (GB/s from counter deltas, share of the link, verdict) follow the counters.

No test asserts how long anything takes: the fake NVML runs on a fake clock (each reading is
``interval`` seconds after the last), so rates are exact however slowly the sampler thread is
scheduled, and tests wait for a number of readings, not for a duration."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from ceiling.probe import nvml, telemetry
from ceiling.probe.telemetry import TelemetrySampler, TelemetrySeries, record

WAIT_S = 60.0  # a bound for a hung sampler thread, not a speed requirement


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


def test_record_does_not_wait_without_nvml(monkeypatch):
    monkeypatch.setattr(nvml, "open_nvml", lambda: (None, "absent"))
    slept: list[float] = []
    monkeypatch.setattr(telemetry.time, "sleep", slept.append)
    series = record(5.0)
    assert slept == []  # nothing to sample: no 5 s wait
    assert not series.available and series.reason == "absent" and series.samples == []


class FakeClock:
    """Stands in for the ``time`` module inside the sampler: ``time()`` advances by ``step`` on
    each reading, so counter deltas give exact rates whatever the thread scheduling."""

    monotonic = staticmethod(time.monotonic)  # the loop's pacing stays real
    sleep = staticmethod(time.sleep)

    def __init__(self, step: float) -> None:
        self.now, self.step = 1000.0, step

    def time(self) -> float:
        self.now += self.step
        return self.now


class FakeNVML:
    """One Gen5 x16 GPU whose PCIe counters grow at ``rate`` bytes/s (TX) and rate/2 (RX) of
    the fake clock; ``readings`` is set once ``want`` samples were taken."""

    NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 196, 197
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1

    def __init__(self, rate: float, clock: FakeClock, counters: bool = True, want: int = 8):
        self.rate, self.clock, self.counters, self.want = rate, clock, counters, want
        self.n, self.readings = 0, threading.Event()

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
        el = self.clock.now - 1000.0
        vals = {196: int(self.rate * el), 197: int(self.rate / 2 * el)}
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(ullVal=vals[i])) for i in ids]

    def nvmlDeviceGetPcieThroughput(self, h, which):
        return self.rate / 1e3 if which == 0 else self.rate / 2e3  # KB/s

    def nvmlDeviceGetUtilizationRates(self, h):  # once per sample
        self.n += 1
        if self.n >= self.want:
            self.readings.set()
        return SimpleNamespace(gpu=90, memory=80)

    def nvmlDeviceGetPowerUsage(self, h):
        return 400_000  # mW

    def nvmlDeviceGetClockInfo(self, h, which):
        return 1980 if which == 1 else 3201

    def nvmlDeviceGetTemperature(self, h, which):
        return 55


def _fake(monkeypatch, rate: float, counters: bool = True, want: int = 8) -> FakeNVML:
    clock = FakeClock(0.02)
    monkeypatch.setattr(telemetry, "time", clock)
    fake = FakeNVML(rate, clock, counters, want)
    monkeypatch.setattr(nvml, "open_nvml", lambda: (fake, None))
    return fake


def _sample(fake: FakeNVML) -> TelemetrySeries:
    """Run the sampler thread until the fake has been read ``want`` times, then stop it."""
    sampler = TelemetrySampler(0.01).start()
    assert sampler.running
    assert fake.readings.wait(WAIT_S), "the sampler thread never took its samples"
    return sampler.stop()


@pytest.mark.parametrize("counters", [True, False])
def test_summary_follows_the_counters(monkeypatch, counters):
    fake = _fake(monkeypatch, rate=0.5e9, counters=counters)  # 0.5 GB/s of a 63 GB/s link
    series = _sample(fake)
    assert series.available and series.pcie_method == ("counters" if counters else "throughput")
    assert len(series.samples) >= fake.want
    assert series.gpus[0].link_GBps == pytest.approx(63.02, abs=0.01)
    s = series.summary(label="decode")
    g = s["gpus"][0]
    assert g["pcie_tx_GBps_mean"] == pytest.approx(0.5, rel=1e-6)
    assert g["pcie_rx_GBps_mean"] == pytest.approx(0.25, rel=1e-6)
    assert g["link_share_pct"] == pytest.approx(100 * 0.5 / 63.02, abs=0.01)  # rounded
    assert g["power_W_mean"] == 400 and g["sm_clock_MHz_mean"] == 1980 and g["temp_C_max"] == 55
    assert s["verdict"].startswith("PCIe traffic during decode: 0.5")
    assert "latency-bound, not bandwidth-bound" in s["verdict"]


def test_busy_link_is_called_bandwidth_bound(monkeypatch):
    s = _sample(_fake(monkeypatch, rate=50e9)).summary()
    assert "bandwidth-bound: the link is busy" in s["verdict"]


def test_window_restricts_the_summary(monkeypatch):
    series = _sample(_fake(monkeypatch, rate=1e9))
    mid = series.samples[len(series.samples) // 2].t
    assert 0 < series.summary(start=mid)["n_samples"] < len(series.samples)
    assert series.summary(start=series.stopped + 1)["n_samples"] == 0


def test_record_samples_for_the_duration(monkeypatch):
    """``record`` starts the thread, waits ``duration_s`` and returns what was sampled."""
    fake = _fake(monkeypatch, rate=1e9, want=1)
    waits: list[float] = []

    def sleep(s: float) -> None:  # the duration passes once the sampler has read the GPU
        waits.append(s)
        assert fake.readings.wait(WAIT_S)

    monkeypatch.setattr(FakeClock, "sleep", staticmethod(sleep))
    series = record(0.3, 0.02)
    assert waits == [0.3]
    assert series.available and series.interval_s == 0.02 and series.samples


def test_a_failing_query_stops_sampling_without_raising(monkeypatch):
    fake = _fake(monkeypatch, rate=1e9, want=2)
    sampler = TelemetrySampler(0.01).start()
    assert fake.readings.wait(WAIT_S)

    def broken(*_a, **_k):
        raise ValueError("driver went away")

    monkeypatch.setattr(nvml, "call", broken)  # every later query raises
    assert sampler._thread is not None
    sampler._thread.join(WAIT_S)  # the thread ends by itself on the first failing query
    assert not sampler.running
    series = sampler.stop()
    assert series.available and series.samples
    assert series.reason and "driver went away" in series.reason
