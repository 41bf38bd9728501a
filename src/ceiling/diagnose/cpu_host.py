"""The CPU as "hardware": what the doctor sets a CPU-served model against.

Why: on a machine without an NVIDIA GPU the predict catalog has nothing to say (its entries are
GPUs), yet the question "is this deployment bandwidth-bound?" still has a numeric answer: the
bytes of weights and KV a decode step must read, divided by the memory bandwidth this CPU
achieves, plus the matrix math at the FLOP rate it achieves. Both rates are measured here with
numpy in well under a second (or taken from the labelled assumptions in
``data/cpu_host.yaml``), so the floors rest on this box, not on a datasheet.
"""

from __future__ import annotations

import json
import os
import platform
import time
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field

from ceiling.errors import CeilingError

_DATA = Path(__file__).resolve().parent.parent / "data" / "cpu_host.yaml"
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "float8": 1}


@cache
def _config() -> dict[str, Any]:
    return yaml.safe_load(_DATA.read_text(encoding="utf-8"))


class CpuHost(BaseModel):
    """The CPU and the rates the floors use, with where each number came from."""

    name: str
    cores: int
    mem_bw_GBps: float
    gflops: float
    measured: bool
    source: str
    llc_bytes: int | None = Field(None, description="last-level cache size (sysfs), if known")

    @property
    def description(self) -> str:
        how = "measured with numpy" if self.measured else "ASSUMED (not measured)"
        return (
            f"CPU only: {self.name}, {self.cores} cores; memory read "
            f"{self.mem_bw_GBps:.3g} GB/s, fp32 matmul {self.gflops:.3g} GFLOP/s ({how})"
        )


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
    import numpy as np

    a = np.ones(max(read_bytes // 8, 1), dtype=np.float64)
    best = float("inf")
    for _ in range(max(repeats, 1)):
        t0 = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t0)
    return a.nbytes / best / 1e9


def measure_gflops(n: int, repeats: int) -> float:
    """Best-of-N float32 matrix-multiply rate (GFLOP/s) through numpy's BLAS."""
    import numpy as np

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


def describe_cpu(measure: bool = True) -> CpuHost:
    """Describe this CPU, measuring its rates unless ``measure`` is False."""
    cfg = _config()
    name, cores = _cpu_name(), os.cpu_count() or 1
    if measure:
        m = cfg["measure"]
        bw = measure_mem_bw_GBps(int(m["read_bytes"]), int(m["repeats"]))
        fl = measure_gflops(int(m["matmul_n"]), int(m["matmul_repeats"]))
        src = (
            f"measured now: numpy sum over {int(m['read_bytes']) >> 20} MiB (best of "
            f"{m['repeats']}), float32 {m['matmul_n']}^3 matmul (best of {m['matmul_repeats']})"
        )
        return CpuHost(
            name=name,
            cores=cores,
            mem_bw_GBps=bw,
            gflops=fl,
            measured=True,
            source=src,
            llc_bytes=last_level_cache_bytes(),
        )
    a = cfg["assumed"]
    return CpuHost(
        name=name,
        cores=cores,
        mem_bw_GBps=float(a["mem_bw_GBps"]),
        gflops=float(a["gflops"]),
        measured=False,
        source=str(a["source"]),
        llc_bytes=last_level_cache_bytes(),
    )


class ModelFootprint(BaseModel):
    """What one decode step must read and compute, from a model directory."""

    name: str
    weight_bytes: int
    params: int
    layers: int
    hidden_size: int
    kv_bytes_per_token: int = Field(description="K and V, all layers, at the weights' dtype")
    dtype: str
    source: str

    @property
    def summary(self) -> str:
        return (
            f"{self.params / 1e6:.3g} M parameters, {self.layers} layers, hidden "
            f"{self.hidden_size}, {self.dtype}; {self.weight_bytes / 1e6:.3g} MB of weights, "
            f"{self.kv_bytes_per_token / 1024:.3g} KiB of KV per token"
        )


def model_footprint(model_dir: str | Path) -> ModelFootprint:
    """Read ``config.json`` and the weight files' sizes of a local model directory."""
    d = Path(model_dir)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise CeilingError(
            f"no config.json in {d}", fix="pass the served model's local directory (--model-path)"
        )
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    files = list(d.glob("*.safetensors")) or list(d.glob("*.bin"))
    if not files:
        raise CeilingError(
            f"no weight files (*.safetensors, *.bin) in {d}",
            fix="pass the served model's local directory (--model-path)",
        )
    wbytes = sum(f.stat().st_size for f in files)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32").replace("torch.", "")
    db = _DTYPE_BYTES.get(dtype, 4)
    layers = int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or 0)
    hidden = int(cfg.get("hidden_size") or cfg.get("n_embd") or 0)
    heads = int(cfg.get("num_attention_heads") or 1)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or (hidden // heads if heads else 0))
    return ModelFootprint(
        name=d.name,
        weight_bytes=wbytes,
        params=wbytes // db,
        layers=layers,
        hidden_size=hidden,
        kv_bytes_per_token=2 * layers * kv_heads * head_dim * db,
        dtype=dtype,
        source=f"{cfg_path} and the sizes of {len(files)} weight file(s)",
    )


def cpu_floor_components(
    fp: ModelFootprint, host: CpuHost, batch: int = 1, context: int = 0
) -> dict[str, float]:
    """The decode step's hardware floors on this CPU, in ms: weights, KV reads, compute.

    Weights are read once per step whatever the batch; KV is read for every sequence's context;
    the math is ~2 FLOPs per parameter per token.
    """
    bw = host.mem_bw_GBps * 1e9
    return {
        "weights": fp.weight_bytes / bw * 1e3,
        "kv": batch * context * fp.kv_bytes_per_token / bw * 1e3,
        "compute": batch * 2.0 * fp.params / (host.gflops * 1e9) * 1e3,
    }
