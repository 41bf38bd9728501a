"""The nouns of ``ceiling probe``: GPUs, GPU pairs, the CPU, the whole topology.

Plain pydantic models with no I/O, shared by the parsers (``topology_parse``: nvidia-smi text
and NVML values -> these models) and the prober (``topology``: the NVML / nvidia-smi / sysfs
calls). They are also what commbench results embed, so field names are part of the JSON.
"""

from __future__ import annotations

import platform

from pydantic import BaseModel, Field

SCHEMA_VERSION = 1

# nvidia-smi connection codes, slowest last: NVLink < PCIe switch < host bridge < cross-socket.
CONNECTION_RANK = {"X": 0, "NV": 1, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 5, "SYS": 6, "SOC": 6}


class GpuInfo(BaseModel):
    """One GPU as the driver reports it."""

    index: int
    name: str
    catalog_name: str | None = Field(None, description="predict's catalog name for this GPU")
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total_GiB: float | None = None
    sm_clock_max_MHz: int | None = None
    mem_clock_max_MHz: int | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    pcie_GBps_per_direction: float | None = Field(
        None, description="theoretical link bandwidth per direction at the max gen/width"
    )
    nvlink_active_links: int | None = Field(None, description="None: NVLink not supported")
    numa_node: int | None = None
    cpu_affinity: str | None = None


class GpuPair(BaseModel):
    """How two GPUs reach each other."""

    a: int
    b: int
    connection: str = Field(description="NV#, PIX, PXB, PHB, NODE or SYS (nvidia-smi topo -m)")
    nvlinks: int = 0
    p2p: bool | None = Field(None, description="peer-to-peer reads possible (None: unknown)")
    p2p_status: str | None = None
    link: str = Field(description="link kind name as predict's catalog calls it")


class NumaNode(BaseModel):
    node: int
    cpus: str


class CpuInfo(BaseModel):
    model: str | None = None
    sockets: int | None = None
    logical_cpus: int | None = None
    numa_nodes: list[NumaNode] = Field(default_factory=list)


class Topology(BaseModel):
    """The whole answer of ``ceiling probe`` (also embedded in commbench results)."""

    schema_version: int = SCHEMA_VERSION
    host: str = Field(default_factory=platform.node)
    source: str = Field(description="nvml | nvidia-smi | none")
    reason: str | None = Field(None, description="why there are no GPUs / why a fallback")
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: list[GpuInfo] = Field(default_factory=list)
    pairs: list[GpuPair] = Field(default_factory=list)
    cpu: CpuInfo = Field(default_factory=CpuInfo)
    notes: list[str] = Field(default_factory=list)

    def pair(self, a: int, b: int) -> GpuPair | None:
        lo, hi = min(a, b), max(a, b)
        return next((p for p in self.pairs if p.a == lo and p.b == hi), None)

    def link_for(self, indices: list[int]) -> str | None:
        """The slowest link among a set of GPUs (what a ring or tree over them must cross)."""
        links = [p for p in self.pairs if p.a in indices and p.b in indices]
        if not links:
            return None
        return max(
            links, key=lambda p: CONNECTION_RANK.get(p.connection.rstrip("0123456789"), 9)
        ).link

    @property
    def link_kinds(self) -> list[str]:
        return sorted({p.link for p in self.pairs})
