"""The nouns and constants of the aiconfigurator adapter (``Fit``, ``TablesInfo``, ``PINNED``,
``FIT_VERSION``, bytes per parameter) and the facts it reads from the package's own system files
(DRAM bandwidth, L2 size). What the adapter reads and how it fits: the package docstring
(``ceiling.predict.tables``); the cache: ``store``; the fits: ``build``; lookups: ``lookup``.
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


#: One table key's measured rows per shape ("8x1x128" -> [[batch, context, us], ...]; GEMM keys
#: per M -> [[n, k, us], ...]; MoE per hidden x inter x experts x top-k -> [[tokens, tp, us]]).
RawTable = dict[str, list[list[float]]]
#: Kernel fits of one op family: table key -> batch size (or "any") -> the fit there.
KernelFits = dict[str, dict[str, Fit]]
FAMILIES = ("gemm", "moe", "attention", "mla", "gdn")


class SystemFits(BaseModel):
    """The fits of one aiconfigurator system (the cache's ``fits.json``) and the allreduce
    points (``comm``: table key -> world size -> [[bytes, us], ...])."""

    system: str
    version: str
    gemm: KernelFits = {}
    moe: KernelFits = {}
    attention: KernelFits = {}
    mla: KernelFits = {}
    gdn: KernelFits = {}
    comm: dict[str, dict[str, list[list[float]]]] = {}
    skipped: list[str] = []  # version folders and tables not read, each with why
    partial: list[str] = []  # tables their collection marked partial (rows used, said)

    def family(self, name: str) -> KernelFits:
        """The fits of one op family (gemm, moe, attention, mla, gdn); {} for another name."""
        return getattr(self, name) if name in FAMILIES else {}


class SystemTables(BaseModel):
    """What the build step reads from one system's parquet files: the fits and the raw rows
    (family -> table key -> rows per shape), the latter stored one key per file."""

    fits: SystemFits
    raw: dict[str, dict[str, RawTable]]


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
    from ceiling.spec.hardware import gpu_catalog

    # an entry without its own l2_MiB counts as unknown here (not the model's default)
    sizes = [
        g.l2_MiB if "l2_MiB" in g.model_fields_set else 0.0
        for g in gpu_catalog().values()
        if g.aic_system == system
    ]
    return (max(sizes) if sizes and max(sizes) > 0 else 128.0) * 2**20
