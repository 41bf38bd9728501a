"""The CPU as "hardware": what the doctor sets a CPU-served model against.

Why: on a machine without an NVIDIA GPU, "is this deployment bandwidth-bound?" still has a
numeric answer: predict's CPU backend (``ceiling.predict.cpu``) divides the bytes of weights
and KV a decode step must read by the memory bandwidth this CPU achieves, and the matrix math
by the FLOP rate it achieves. Both rates are measured here with numpy in well under a second
(or taken from the labelled assumptions in ``data/cpu_host.yaml``), so the floors rest on this
box, not on a datasheet; the result is a :class:`~ceiling.spec.hardware.CpuHardware`.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from ceiling.spec._data import DataModel, load_yaml
from ceiling.spec.hardware import CpuHardware


class CpuMeasure(DataModel):
    read_bytes: int
    repeats: int
    matmul_n: int
    matmul_repeats: int


class CpuAssumed(DataModel):
    mem_bw_GBps: float
    gflops: float
    source: str


class CpuHostFile(DataModel):
    """``data/cpu_host.yaml``: how this CPU's rates are measured, and what is assumed without."""

    schema_version: int
    measure: CpuMeasure
    assumed: CpuAssumed


def describe(
    name: str, cores: int, bw: float, gflops: float, measured: bool, source: str, **kw: Any
) -> CpuHardware:
    """A CpuHardware with its one-line description."""
    how = "measured with numpy" if measured else "ASSUMED (not measured)"
    return CpuHardware(
        name=name,
        cores=cores,
        mem_bw_GBps=bw,
        gflops=gflops,
        measured=measured,
        source=source,
        description=f"CPU only: {name}, {cores} cores; memory read {bw:.3g} GB/s, fp32 matmul "
        f"{gflops:.3g} GFLOP/s ({how})",
        **kw,
    )


def memory_GiB() -> float | None:
    """Physical memory of this machine (None when the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def last_level_cache_bytes(sys_root: str = "/sys") -> int | None:
    """The largest cache of CPU 0 (sysfs ``cache/index*/size``, e.g. ``32768K``), or None."""
    best = None
    for d in Path(sys_root, "devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (d / "size").read_text().strip().upper()
        except OSError:
            continue
        mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        digits = text[:-1] if text[-1:] in "KMG" else text
        if digits.isdigit():
            best = max(best or 0, int(digits) * mult)
    return best


def measure_mem_bw_GBps(read_bytes: int, repeats: int) -> float:
    """Best-of-N streaming read bandwidth (GB/s) of a numpy reduction over a large array."""
    a = np.ones(max(read_bytes // 8, 1), dtype=np.float64)
    best = float("inf")
    for _ in range(max(repeats, 1)):
        t0 = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t0)
    return a.nbytes / best / 1e9


def measure_gflops(n: int, repeats: int) -> float:
    """Best-of-N float32 matrix-multiply rate (GFLOP/s) through numpy's BLAS."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, n), dtype=np.float32)
    y = rng.standard_normal((n, n), dtype=np.float32)
    x @ y  # warm-up: BLAS thread start
    best = float("inf")
    for _ in range(max(repeats, 1)):
        t0 = time.perf_counter()
        x @ y
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best / 1e9


def describe_cpu(measure: bool = True, gpu_probe: str | None = None) -> CpuHardware:
    """Describe this CPU, measuring its rates unless ``measure`` is False (``gpu_probe``: why
    no GPU is used, kept with the description)."""
    cfg = load_yaml("cpu_host.yaml", schema=CpuHostFile)
    name, cores = _cpu_name(), os.cpu_count() or 1
    extra: dict[str, Any] = {
        "llc_bytes": last_level_cache_bytes(),
        "memory_GiB": memory_GiB(),
        "gpu_probe": gpu_probe,
    }
    if measure:
        m = cfg.measure
        bw = measure_mem_bw_GBps(m.read_bytes, m.repeats)
        fl = measure_gflops(m.matmul_n, m.matmul_repeats)
        src = (
            f"measured now: numpy sum over {m.read_bytes >> 20} MiB (best of "
            f"{m.repeats}), float32 {m.matmul_n}^3 matmul (best of {m.matmul_repeats})"
        )
        return describe(name, cores, bw, fl, True, src, **extra)
    a = cfg.assumed
    return describe(name, cores, a.mem_bw_GBps, a.gflops, False, a.source, **extra)
