"""What is in this box and how its GPUs are linked: ``ceiling probe``.

Sources, best first: NVML (``nvidia-ml-py``), then ``nvidia-smi`` (its CSV query and the
``topo -m`` / ``topo -p2p r`` matrices), then nothing (a CPU-only description with ``gpus: []``).
This module does the I/O only (NVML queries, nvidia-smi runs, sysfs reads); the readings become
nouns (``topology_model``) through the pure parsers of ``topology_parse``. The nouns and the
parsers are re-exported here, where callers have always imported them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from ceiling.probe import nvml
from ceiling.probe.topology_model import (
    SCHEMA_VERSION,
    CpuInfo,
    GpuInfo,
    GpuPair,
    NumaNode,
    Topology,
)
from ceiling.probe.topology_parse import (
    NVML_P2P_OK,
    SMI_FIELDS,
    catalog_gpu,
    common_gen,
    cuda_version,
    gpu_from_nvml,
    link_kind,
    nvlink_kind,
    pair_from_nvml,
    parse_smi_query,
    parse_topo_matrix,
    pcie_GBps,
    prefer_smi_connections,
    smi_driver_version,
    topology_from_smi_text,
)

__all__ = [
    "SCHEMA_VERSION",
    "CpuInfo",
    "GpuInfo",
    "GpuPair",
    "NumaNode",
    "Topology",
    "catalog_gpu",
    "cpu_info",
    "link_kind",
    "parse_smi_query",
    "parse_topo_matrix",
    "pcie_GBps",
    "probe",
    "topology_from_smi_text",
]


def cpu_info(sys_root: str = "/sys", cpuinfo: str = "/proc/cpuinfo") -> CpuInfo:
    """Sockets and NUMA nodes from sysfs (no lscpu needed); model name from /proc/cpuinfo."""
    info = CpuInfo(logical_cpus=os.cpu_count())
    node_dir = Path(sys_root, "devices/system/node")
    for d in sorted(node_dir.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpulist = d / "cpulist"
        if cpulist.is_file():
            info.numa_nodes.append(NumaNode(node=int(d.name[4:]), cpus=cpulist.read_text().strip()))
    pkgs = {
        p.read_text().strip()
        for p in Path(sys_root, "devices/system/cpu").glob("cpu[0-9]*/topology/physical_package_id")
    }
    info.sockets = len(pkgs) or None
    try:
        for ln in Path(cpuinfo).read_text().splitlines():
            if ln.lower().startswith("model name"):
                info.model = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def probe(use_nvml: bool = True, use_smi: bool = True) -> Topology:
    """Describe this machine. Never raises because GPUs or drivers are missing."""
    reasons = []
    if use_nvml:
        pynvml, why = nvml.open_nvml()
        if pynvml is not None:
            topo = _probe_nvml(pynvml)
            if topo.gpus:
                return topo
            reasons.append("NVML sees no GPU")
        else:
            reasons.append(why or "NVML unavailable")
    if use_smi and shutil.which("nvidia-smi"):
        smi = _probe_smi()
        if smi is not None and smi.gpus:
            smi.notes.append("NVML unavailable, described from nvidia-smi: " + "; ".join(reasons))
            return smi
        reasons.append("nvidia-smi lists no GPU")
    elif use_smi:
        reasons.append("nvidia-smi not found")
    return Topology(source="none", reason="no NVIDIA GPU: " + "; ".join(reasons), cpu=cpu_info())


def _probe_nvml(p: Any) -> Topology:
    c = nvml.call
    topo = Topology(
        source="nvml",
        driver_version=c(lambda: nvml.text(p.nvmlSystemGetDriverVersion())),
        cuda_driver_version=cuda_version(c(p.nvmlSystemGetCudaDriverVersion)),
        cpu=cpu_info(),
    )
    handles = []
    for i in range(c(p.nvmlDeviceGetCount, default=0)):
        h = c(p.nvmlDeviceGetHandleByIndex, i)
        if h is None:
            continue
        handles.append(h)
        mem = c(p.nvmlDeviceGetMemoryInfo, h)
        pci = c(p.nvmlDeviceGetPciInfo, h)
        bus = nvml.text(pci.busId) if pci is not None else None
        links = _nvlinks(p, h)
        topo.gpus.append(
            gpu_from_nvml(
                i,
                nvml.text(c(p.nvmlDeviceGetName, h, default="unknown")),
                uuid=c(lambda h=h: nvml.text(p.nvmlDeviceGetUUID(h))),
                pci_bus_id=bus,
                memory_total_bytes=mem.total if mem is not None else None,
                sm_clock_max_MHz=c(p.nvmlDeviceGetMaxClockInfo, h, p.NVML_CLOCK_SM),
                mem_clock_max_MHz=c(p.nvmlDeviceGetMaxClockInfo, h, p.NVML_CLOCK_MEM),
                pcie_gen_current=c(p.nvmlDeviceGetCurrPcieLinkGeneration, h),
                pcie_gen_max=c(p.nvmlDeviceGetMaxPcieLinkGeneration, h),
                pcie_width_current=c(p.nvmlDeviceGetCurrPcieLinkWidth, h),
                pcie_width_max=c(p.nvmlDeviceGetMaxPcieLinkWidth, h),
                nvlinks_active=None if links is None else len(links),
                numa_node=_numa_of(bus),
            )
        )
    gen = common_gen(topo.gpus)
    nvl = nvlink_kind(topo.gpus[0].catalog_name) if topo.gpus else "nvlink"
    found = list(zip(topo.gpus, handles, strict=True))
    for ia, (ga, ha) in enumerate(found):
        for gb, hb in found[ia + 1 :]:
            nv = _nvlinks_between(p, ha, gb.pci_bus_id)
            nvlink_caps = getattr(p, "NVML_P2P_CAPS_INDEX_NVLINK", 3)
            nvp2p = c(p.nvmlDeviceGetP2PStatus, ha, hb, nvlink_caps) if not nv else None
            topo.pairs.append(
                pair_from_nvml(
                    ga,
                    gb,
                    nvlinks_to_peer=nv,
                    nvlink_p2p_ok=nvp2p == NVML_P2P_OK,
                    ancestor=c(p.nvmlDeviceGetTopologyCommonAncestor, ha, hb),
                    p2p_read_status=c(p.nvmlDeviceGetP2PStatus, ha, hb, p.NVML_P2P_CAPS_INDEX_READ),
                    pcie_gen=gen,
                    nvlink=nvl,
                )
            )
    if len(handles) > 1 and shutil.which("nvidia-smi"):
        prefer_smi_connections(topo, _run(["nvidia-smi", "topo", "-m"]) or "", gen, nvl)
    if len(handles) == 1:
        topo.notes.append("one GPU: no GPU pairs, so no link to describe")
    return topo


def _nvlinks(p: Any, h: Any) -> list[int] | None:
    """Indices of active NVLinks, or None when the GPU has no NVLink."""
    active, supported = [], False
    for link in range(getattr(p, "NVML_NVLINK_MAX_LINKS", 18)):
        state = nvml.call(p.nvmlDeviceGetNvLinkState, h, link)
        if state is None:
            continue
        supported = True
        if state:
            active.append(link)
    return active if supported else None


def _nvlinks_between(p: Any, h: Any, peer_bus: str | None) -> int:
    if peer_bus is None:
        return 0
    n = 0
    for link in _nvlinks(p, h) or []:
        remote = nvml.call(p.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
        if remote is not None and nvml.text(remote.busId).lower() == peer_bus.lower():
            n += 1
    return n


def _numa_of(bus_id: str | None) -> int | None:
    if not bus_id:
        return None
    # NVML's busId is 00000000:18:00.0; sysfs uses the 4-digit domain form 0000:18:00.0.
    short = bus_id.lower()[-12:]
    try:
        node = int(Path(f"/sys/bus/pci/devices/{short}/numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _run(args: list[str]) -> str | None:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _probe_smi() -> Topology | None:
    query = _run(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"])
    if not query:
        return None
    gpus = parse_smi_query(query)
    return topology_from_smi_text(
        gpus,
        _run(["nvidia-smi", "topo", "-m"]) or "",
        _run(["nvidia-smi", "topo", "-p2p", "r"]),
        driver=smi_driver_version(query) if gpus else None,
        cpu=cpu_info(),
    )
