"""The one adapter to aiconfigurator's measured per-operation tables (optional extra).

``pip install 'ceiling[tables]'`` brings NVIDIA's ``aiconfigurator-core`` (Apache-2.0), whose
``systems/data/<system>/<op>/<engine>/<version>/*.parquet`` hold kernel latencies measured per
GPU system and engine version. ``predict`` never needs it (it has priors); when it is present,
this module turns the tables into small per-kernel fits and ``predict`` marks those ops
``source: table``.

What it reads (decode-relevant rows only), and the fit it keeps per kernel:

- ``gemm``: latency at M = 1..1025 tokens over a grid of (N, K) -> per M, ``t = t0 + bytes/bw``.
  The slope comes from weights above 1.5x the GPU's L2 (the tables time each shape in a loop,
  so small weights are L2-hot there but are streamed from DRAM in a real step); ``t0`` is the
  median excess over that line of 1-16 MB shapes (decode-sized matrices).
- ``moe``: fused-MoE latency at 1..512 tokens (balanced routing, EP = 1) -> per token count,
  ``t = t0 + active expert bytes/bw`` (active experts = min(E, tokens x top-k)).
- ``attention`` (GQA decode), ``mla`` (MLA decode kernel), ``gdn`` (gated-delta-rule decode):
  ``t = t0 + KV-or-state bytes/bw`` per kernel and KV dtype.
- ``comm``: allreduce latency vs message size per world size, NCCL and the engines' custom
  allreduce (kept as points; looked up by log-log interpolation).

Table quality is checked before a fit is trusted (``quality``): a slope faster than the
datasheet bandwidth, a relative fit error above 35 %, or a kernel whose small-shape latency is
3x another engine's kernel for the same format on the same GPU (JIT or warm-up in the
measurement, or a slow fallback the engine does not pick at decode) are flagged, and ``predict``
falls back to the next evidence.

Cold-start cost: building the fits reads the parquet files of one GPU system once (a few
seconds, pyarrow); they are cached as JSON under ``$XDG_CACHE_HOME/ceiling`` (or
``~/.cache/ceiling``), keyed by the package version, so later predictions load a few kilobytes.
"""

from __future__ import annotations

import os
from functools import cache
from importlib import metadata, util
from pathlib import Path

from pydantic import BaseModel

PACKAGE = "aiconfigurator_core"
DIST = "aiconfigurator-core"
PINNED = "0.12.0"  # the pyproject extra pins this; other versions are read but reported
# bump when the fitting or the cache layout changes: the JSON cache is keyed by it (it holds
# raw rows and fits only; lookups such as the GEMM interpolation are not cached)
FIT_VERSION = 7
BYTES_PER_PARAM = {
    "bfloat16": 2.0,
    "float16": 2.0,
    "fp8": 1.0,
    "fp8_block": 1.0 + 4 / (128 * 128),
    "nvfp4": 0.5 + 1 / 16,
    "int4_wo": 0.5 + 2 / 128,
    "int8_wo": 1.0 + 2 / 128,
    "w4a16_mxfp4": 0.5 + 1 / 32,
    "w4a8_mxfp4_mxfp8": 0.5 + 1 / 32,
    "sq": 1.0,
}
RAW_MAX_TOKENS = 256  # raw rows kept for exact-shape lookups (decode batches)
RAW_GEMM_M = (1, 2, 4, 8, 16, 32, 64, 128, 256)
KV_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0}


class Fit(BaseModel):
    """``t_us = t0_us + bytes / (bw_GBps * 1e3)`` for one kernel at one batch size."""

    key: str
    t0_us: float
    bw_GBps: float
    rel_err: float
    points: int
    trusted: bool = True
    note: str = ""

    def us(self, nbytes: float, fallback_bw_GBps: float) -> float:
        """Latency of ``nbytes``; a fit without a slope uses ``fallback_bw_GBps``."""
        bw = self.bw_GBps if self.bw_GBps > 0 else fallback_bw_GBps
        return self.t0_us + nbytes / (bw * 1e3)


class TablesInfo(BaseModel):
    version: str
    root: str
    pinned: bool
    systems: list[str]


# ----------------------------------------------------------------------------- discovery


@cache
def info() -> TablesInfo | None:
    """The installed aiconfigurator-core data package, or None (predict then uses priors)."""
    if os.environ.get("CEILING_NO_TABLES"):
        return None
    spec = util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))) / "systems" / "data"
    if not root.is_dir():
        return None
    try:
        version = metadata.version(DIST)
    except metadata.PackageNotFoundError:
        version = "unknown"
    systems = sorted(p.name for p in root.iterdir() if p.is_dir())
    return TablesInfo(version=version, root=str(root), pinned=version == PINNED, systems=systems)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ceiling"


@cache
def system_bw_GBps(system: str) -> float | None:
    """The DRAM bandwidth aiconfigurator's own system file states for ``system`` (GB/s)."""
    tinfo = info()
    if tinfo is None:
        return None
    path = Path(tinfo.root).parent / f"{system}.yaml"
    try:
        import yaml

        return float(yaml.safe_load(path.read_text())["gpu"]["mem_bw"]) / 1e9
    except (OSError, KeyError, TypeError, ValueError):
        return None


def _l2_bytes(system: str) -> float:
    """L2 of the GPU an aiconfigurator system holds (from our catalog; 128 MiB if unknown)."""
    from ceiling.spec._data import load_yaml

    sizes = [
        float(e.get("l2_MiB") or 0)
        for e in load_yaml("gpus.yaml").values()
        if isinstance(e, dict) and e.get("aic_system") == system
    ]
    return (max(sizes) if sizes and max(sizes) > 0 else 128.0) * 2**20
