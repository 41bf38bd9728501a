"""Hardware: the GPU and the link between GPUs, from the catalog data files.

Numbers come from ``data/gpus.yaml`` and ``data/links.yaml`` (datasheets, published
measurements, each with its source). A measured :class:`~ceiling.spec.profile.HardwareProfile`
overrides any of them through :func:`apply_profile`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ceiling.errors import CeilingError
from ceiling.spec._data import load_yaml


class GPU(BaseModel):
    name: str
    full_name: str
    arch: str
    memory_GiB: float
    mem_bw_GBps: float = Field(description="datasheet bandwidth")
    measured_bw_GBps: float | None = Field(None, description="achieved weight-read bandwidth")
    tflops: dict[str, float]
    nvlink: str | None = None
    pcie_gen: int = 4
    p2p_supported: bool = True
    aliases: list[str] = Field(default_factory=list)
    source: str = ""

    @property
    def memory_bytes(self) -> float:
        return self.memory_GiB * 2**30

    def peak_tflops(self, compute: str) -> float:
        """Dense peak for a compute dtype; without native support the GEMM runs as w-only
        quantization (Marlin-style) in bf16, so bf16 is the fallback."""
        return self.tflops.get(compute, self.tflops["bf16"])


class NcclFit(BaseModel):
    base_us: float
    hop_us: float
    busbw_GBps: float


class OneshotFit(BaseModel):
    base_us: float
    per_rank_us: float
    ingress_GBps: float


class Link(BaseModel):
    name: str
    description: str
    kind: str  # nvlink | pcie-switch | pcie-host | pcie-cross-socket
    p2p: bool
    bw_GBps: float
    p2p_us: float
    custom_ar_class: str  # nvlink | pcie | none
    nccl: NcclFit
    oneshot: OneshotFit | None = None
    source: str = ""


def _catalog(file: str) -> dict[str, dict[str, Any]]:
    data = load_yaml(file)
    return {name: {**entry, "name": name} for name, entry in data.items()}


def _resolve(name: str, cat: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    if key in cat:
        return cat[key]
    for entry in cat.values():
        if key in entry.get("aliases", []):
            return entry
    return None


def load_gpu(name: str) -> GPU:
    """A GPU from the catalog by name or alias (``rtx-pro-6000``, ``h200``, ...)."""
    entry = _resolve(name, _catalog("gpus.yaml"))
    if entry is None:
        raise CeilingError(
            f"unknown GPU '{name}'",
            fix="one of: "
            + ", ".join(_catalog("gpus.yaml"))
            + " (see `ceiling predict --list-gpus`)",
        )
    return GPU.model_validate(entry)


def load_link(name: str) -> Link:
    """A link kind from the catalog (``pcie5-switch``, ``nvlink4``, ...)."""
    entry = _resolve(name, _catalog("links.yaml"))
    if entry is None:
        raise CeilingError(
            f"unknown link '{name}'",
            fix="one of: "
            + ", ".join(_catalog("links.yaml"))
            + " (see `ceiling predict --list-links`)",
        )
    return Link.model_validate(entry)


def list_gpus() -> list[GPU]:
    return [GPU.model_validate(e) for e in _catalog("gpus.yaml").values()]


def list_links() -> list[Link]:
    return [Link.model_validate(e) for e in _catalog("links.yaml").values()]


def nvlink_for(gpu: GPU) -> str | None:
    """The NVLink kind a GPU can use, for the 'NVLink instead of PCIe' what-if."""
    return gpu.nvlink
