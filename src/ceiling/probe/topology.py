"""What is in this box and how its GPUs are linked: ``ceiling probe``.

Sources, best first: NVML (``nvidia-ml-py``), then ``nvidia-smi`` (its CSV query and the
``topo -m`` / ``topo -p2p r`` matrices), then nothing (a CPU-only description with ``gpus: []``).
The pair connection is NVIDIA's own vocabulary (NV#, PIX, PXB, PHB, NODE, SYS); ``link`` maps it
onto the link kinds that ``predict`` knows (nvlink, pcie5-switch, pcie5-hostbridge,
pcie5-xsocket, ...), because that is the question a decode step asks: what does each allreduce
cross?
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ceiling.probe import nvml

SCHEMA_VERSION = 1
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CONN = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")


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
        return max(links, key=lambda p: _RANK.get(p.connection.rstrip("0123456789"), 9)).link

    @property
    def link_kinds(self) -> list[str]:
        return sorted({p.link for p in self.pairs})


# Slowest last: NVLink < PCIe switch < host bridge < cross-socket.
_RANK = {"X": 0, "NV": 1, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 5, "SYS": 6, "SOC": 6}


@cache
def _pcie_table() -> dict[int, dict[str, float]]:
    import yaml

    path = Path(__file__).resolve().parents[1] / "data" / "pcie.yaml"
    data = yaml.safe_load(path.read_text())
    return {int(k): v for k, v in data["generations"].items()}


def pcie_GBps(gen: int | None, width: int | None) -> float | None:
    """Theoretical per-direction bandwidth of a PCIe link (data/pcie.yaml)."""
    if not gen or not width:
        return None
    row = _pcie_table().get(int(gen))
    if row is None:
        return None
    return round(row["gt_per_s"] * row["encoding"] / 8 * width, 2)


_PCIE_PLACE = {
    "PIX": "switch",
    "PXB": "switch",
    "PHB": "host",
    "NODE": "host",
    "SYS": "cross-socket",
}


@cache
def _catalog_links() -> frozenset[str]:
    """Link names predict's catalog knows (empty if the catalog is not available)."""
    try:
        from ceiling.spec.hardware import list_links

        return frozenset(link.name for link in list_links())
    except Exception:
        return frozenset()


def catalog_gpu(raw_name: str) -> str | None:
    """The catalog name of a GPU the driver calls e.g. 'NVIDIA H200' (None if unknown)."""
    try:
        from ceiling.spec.hardware import load_gpu
    except Exception:
        return None
    words = re.sub(r"^nvidia\s+", "", raw_name.strip().lower()).replace("_", " ").split()
    for n in range(len(words), 0, -1):
        try:
            return load_gpu("-".join(words[:n])).name
        except Exception:
            continue
    return None


def nvlink_kind(gpu_catalog_name: str | None) -> str:
    try:
        from ceiling.spec.hardware import load_gpu

        return (load_gpu(gpu_catalog_name).nvlink if gpu_catalog_name else None) or "nvlink"
    except Exception:
        return "nvlink"


def link_kind(
    connection: str, pcie_gen: int | None, p2p: bool | None = None, nvlink: str = "nvlink"
) -> str:
    """Map an nvidia-smi connection code onto predict's link kind names (data/links.yaml).

    NV# -> the GPU's NVLink generation (nvlink4 on Hopper); PIX/PXB (PCIe switches) ->
    pcie<g>-switch; PHB/NODE (CPU root complex, one socket) -> pcie<g>-host; SYS (across the
    socket interconnect) -> pcie<g>-cross-socket; with P2P off the catalog's ``-nop2p`` kind when
    it has one. ``g`` is the GPUs' PCIe generation.
    """
    code = connection.strip().upper()
    if code.startswith("NV"):
        return nvlink
    if code == "X":
        return "self"
    place = _PCIE_PLACE.get(code, "cross-socket" if code == "SOC" else "unknown")
    pcie = f"pcie{pcie_gen}" if pcie_gen else "pcie"
    name = f"{pcie}-{place}"
    candidates = [name]
    if p2p is False:
        candidates = [f"{name}-nop2p", f"{pcie}-nop2p", name]
    known = _catalog_links()
    return next((c for c in candidates if c in known), candidates[0])


# --------------------------------------------------------------------------- nvidia-smi text


def parse_topo_matrix(text: str) -> dict[str, Any]:
    """Parse ``nvidia-smi topo -m`` (or ``topo -p2p r``) output.

    Returns ``{"devices": [...], "matrix": {(row, col): code}, "affinity": {gpu: {...}}}``.
    Rows are split on tabs (nvidia-smi's separator; cells may be empty), falling back to runs of
    two or more spaces; the legend below the matrix is ignored.
    """
    lines = [_ANSI.sub("", ln).rstrip() for ln in text.splitlines()]
    header_idx = next((i for i, ln in enumerate(lines) if re.match(r"^\s*GPU0(\s|$)", ln)), None)
    if header_idx is None:
        return {"devices": [], "matrix": {}, "affinity": {}}
    header = _split(lines[header_idx])
    devices = [h for h in header if re.fullmatch(r"(GPU|NIC|mlx)\S*", h)]
    extra_cols = header[len(devices) :]
    matrix: dict[tuple[str, str], str] = {}
    affinity: dict[str, dict[str, str]] = {}
    for ln in lines[header_idx + 1 :]:
        if not ln.strip() or ln.strip().startswith("Legend"):
            if matrix:
                break
            continue
        cells = [c.strip() for c in (ln.split("\t") if "\t" in ln else _split(ln))]
        name, values = cells[0], cells[1:]
        if name not in devices:
            continue
        conn, rest = values[: len(devices)], [v for v in values[len(devices) :] if v]
        for col, code in zip(devices, conn, strict=False):
            matrix[(name, col)] = code
        if name.startswith("GPU"):
            affinity[name] = dict(zip(extra_cols, rest, strict=False))
    return {"devices": devices, "matrix": matrix, "affinity": affinity}


def _split(line: str) -> list[str]:
    if "\t" in line:
        return [c.strip() for c in line.split("\t") if c.strip()]
    return [c for c in re.split(r"\s{2,}", line.strip()) if c]


def pairs_from_matrix(
    topo: dict[str, Any],
    p2p: dict[str, Any] | None,
    pcie_gen: int | None,
    nvlink: str = "nvlink",
) -> list[GpuPair]:
    """GPU pairs from parsed ``topo -m`` (and optionally ``topo -p2p r``) matrices."""
    gpus = sorted((d for d in topo["devices"] if d.startswith("GPU")), key=lambda d: int(d[3:]))
    out = []
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            code = topo["matrix"].get((a, b), "")
            if not _CONN.match(code):
                continue
            status = p2p["matrix"].get((a, b)) if p2p else None
            nv = int(code[2:]) if code.startswith("NV") else 0
            ok = None if status is None else status == "OK"
            out.append(
                GpuPair(
                    a=int(a[3:]),
                    b=int(b[3:]),
                    connection=code,
                    nvlinks=nv,
                    p2p=ok,
                    p2p_status=status,
                    link=link_kind(code, pcie_gen, ok, nvlink),
                )
            )
    return out


_SMI_FIELDS = (
    "index,name,uuid,pci.bus_id,memory.total,clocks.max.sm,clocks.max.memory,"
    "pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,"
    "driver_version"
)


def parse_smi_query(text: str) -> list[GpuInfo]:
    """Parse ``nvidia-smi --query-gpu=<_SMI_FIELDS> --format=csv,noheader,nounits``."""
    gpus = []
    for ln in text.strip().splitlines():
        f = [c.strip() for c in ln.split(",")]
        if len(f) < 11:
            continue
        gen_max, width_max = _int(f[8]), _int(f[10])
        mem = _int(f[4])
        gpus.append(
            GpuInfo(
                index=int(f[0]),
                name=f[1],
                catalog_name=catalog_gpu(f[1]),
                uuid=f[2] or None,
                pci_bus_id=f[3] or None,
                memory_total_GiB=round(mem / 1024, 2) if mem else None,
                sm_clock_max_MHz=_int(f[5]),
                mem_clock_max_MHz=_int(f[6]),
                pcie_gen_current=_int(f[7]),
                pcie_gen_max=gen_max,
                pcie_width_current=_int(f[9]),
                pcie_width_max=width_max,
                pcie_GBps_per_direction=pcie_GBps(gen_max, width_max),
            )
        )
    return gpus


def _int(s: str) -> int | None:
    try:
        return int(float(s))
    except (TypeError, ValueError):
        return None


# --------------------------------------------------------------------------- CPU


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


# --------------------------------------------------------------------------- probing


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
        topo = _probe_smi()
        if topo is not None and topo.gpus:
            topo.notes.append("NVML unavailable, described from nvidia-smi: " + "; ".join(reasons))
            return topo
        reasons.append("nvidia-smi lists no GPU")
    elif use_smi:
        reasons.append("nvidia-smi not found")
    return Topology(source="none", reason="no NVIDIA GPU: " + "; ".join(reasons), cpu=cpu_info())


def _probe_nvml(p: Any) -> Topology:
    c = nvml.call
    topo = Topology(
        source="nvml",
        driver_version=c(lambda: nvml.text(p.nvmlSystemGetDriverVersion())),
        cuda_driver_version=_cuda_version(c(p.nvmlSystemGetCudaDriverVersion)),
        cpu=cpu_info(),
    )
    handles = []
    for i in range(c(p.nvmlDeviceGetCount, default=0)):
        h = c(p.nvmlDeviceGetHandleByIndex, i)
        if h is None:
            continue
        handles.append((i, h))
        mem = c(p.nvmlDeviceGetMemoryInfo, h)
        gen_max = c(p.nvmlDeviceGetMaxPcieLinkGeneration, h)
        width_max = c(p.nvmlDeviceGetMaxPcieLinkWidth, h)
        pci = c(p.nvmlDeviceGetPciInfo, h)
        bus = nvml.text(pci.busId) if pci is not None else None
        links = _nvlinks(p, h)
        raw = nvml.text(c(p.nvmlDeviceGetName, h, default="unknown"))
        topo.gpus.append(
            GpuInfo(
                index=i,
                name=raw,
                catalog_name=catalog_gpu(raw),
                uuid=c(lambda h=h: nvml.text(p.nvmlDeviceGetUUID(h))),
                pci_bus_id=bus,
                memory_total_GiB=round(mem.total / 2**30, 2) if mem is not None else None,
                sm_clock_max_MHz=c(p.nvmlDeviceGetMaxClockInfo, h, p.NVML_CLOCK_SM),
                mem_clock_max_MHz=c(p.nvmlDeviceGetMaxClockInfo, h, p.NVML_CLOCK_MEM),
                pcie_gen_current=c(p.nvmlDeviceGetCurrPcieLinkGeneration, h),
                pcie_gen_max=gen_max,
                pcie_width_current=c(p.nvmlDeviceGetCurrPcieLinkWidth, h),
                pcie_width_max=width_max,
                pcie_GBps_per_direction=pcie_GBps(gen_max, width_max),
                nvlink_active_links=None if links is None else len(links),
                numa_node=_numa_of(bus),
            )
        )
    gen = _common_gen(topo.gpus)
    nvl = nvlink_kind(topo.gpus[0].catalog_name) if topo.gpus else "nvlink"
    for ia, (a, ha) in enumerate(handles):
        for b, hb in handles[ia + 1 :]:
            anc = c(p.nvmlDeviceGetTopologyCommonAncestor, ha, hb)
            nv = _nvlinks_between(p, ha, topo.gpus[b].pci_bus_id)
            if not nv:
                # NVSwitch boards: links end at switches, not at the peer; NVML still says
                # whether the pair can do P2P over NVLink. Count the GPU's active links then.
                nvp2p = c(
                    p.nvmlDeviceGetP2PStatus, ha, hb, getattr(p, "NVML_P2P_CAPS_INDEX_NVLINK", 3)
                )
                if nvp2p == p.NVML_P2P_STATUS_OK:
                    nv = min(
                        topo.gpus[a].nvlink_active_links or 0, topo.gpus[b].nvlink_active_links or 0
                    )
            code = f"NV{nv}" if nv else _ANCESTOR.get(anc, "SYS")
            st = c(p.nvmlDeviceGetP2PStatus, ha, hb, p.NVML_P2P_CAPS_INDEX_READ)
            ok = None if st is None else st == p.NVML_P2P_STATUS_OK
            topo.pairs.append(
                GpuPair(
                    a=a,
                    b=b,
                    connection=code,
                    nvlinks=nv,
                    p2p=ok,
                    p2p_status=None if st is None else _P2P_STATUS.get(st, str(st)),
                    link=link_kind(code, gen, ok, nvl),
                )
            )
    if len(handles) > 1 and shutil.which("nvidia-smi"):
        _cross_check(topo, _run(["nvidia-smi", "topo", "-m"]) or "", gen, nvl)
    if len(handles) == 1:
        topo.notes.append("one GPU: no GPU pairs, so no link to describe")
    return topo


# nvmlGpuTopologyLevel_t -> nvidia-smi's code
_ANCESTOR = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_P2P_STATUS = {
    0: "OK",
    1: "CHIPSET_NOT_SUPPORTED",
    2: "GPU_NOT_SUPPORTED",
    3: "IOH_TOPOLOGY_NOT_SUPPORTED",
    4: "DISABLED_BY_REGKEY",
    5: "NOT_SUPPORTED",
    6: "UNKNOWN",
}


def _cross_check(topo: Topology, topo_text: str, gen: int | None, nvl: str) -> None:
    """Prefer ``nvidia-smi topo -m``'s connection code where NVML's reading differs.

    nvidia-smi is what users compare against, and it knows NVSwitch and VM quirks that the
    common-ancestor query can miss; the disagreement is kept as a note.
    """
    parsed = parse_topo_matrix(topo_text)
    for pr in topo.pairs:
        code = parsed["matrix"].get((f"GPU{pr.a}", f"GPU{pr.b}"))
        if code and _CONN.match(code) and code != pr.connection:
            topo.notes.append(
                f"GPU{pr.a}-GPU{pr.b}: NVML reads {pr.connection}, nvidia-smi topo -m says "
                f"{code}; using nvidia-smi"
            )
            pr.connection = code
            pr.nvlinks = int(code[2:]) if code.startswith("NV") else 0
            pr.link = link_kind(code, gen, pr.p2p, nvl)


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


def _common_gen(gpus: list[GpuInfo]) -> int | None:
    gens = [g.pcie_gen_max for g in gpus if g.pcie_gen_max]
    return min(gens) if gens else None


def _cuda_version(v: int | None) -> str | None:
    return None if not v else f"{v // 1000}.{(v % 1000) // 10}"


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
    query = _run(["nvidia-smi", f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits"])
    if not query:
        return None
    gpus = parse_smi_query(query)
    driver = query.strip().splitlines()[0].split(",")[-1].strip() if gpus else None
    return topology_from_smi_text(
        gpus,
        _run(["nvidia-smi", "topo", "-m"]) or "",
        _run(["nvidia-smi", "topo", "-p2p", "r"]),
        driver=driver,
    )


def topology_from_smi_text(
    gpus: list[GpuInfo], topo_text: str, p2p_text: str | None, driver: str | None = None
) -> Topology:
    """Build a Topology from nvidia-smi outputs (the fallback path; also used by tests)."""
    topo = parse_topo_matrix(topo_text)
    p2p = parse_topo_matrix(p2p_text) if p2p_text else None
    for g in gpus:
        aff = topo["affinity"].get(f"GPU{g.index}", {})
        g.cpu_affinity = aff.get("CPU Affinity")
        g.numa_node = _int(aff.get("NUMA Affinity", ""))
    nvl = nvlink_kind(gpus[0].catalog_name) if gpus else "nvlink"
    pairs = pairs_from_matrix(topo, p2p, _common_gen(gpus), nvl)
    for pr in pairs:
        if pr.nvlinks:
            for idx in (pr.a, pr.b):
                g = next((x for x in gpus if x.index == idx), None)
                if g is not None:
                    g.nvlink_active_links = max(g.nvlink_active_links or 0, pr.nvlinks)
    return Topology(
        source="nvidia-smi", driver_version=driver, gpus=gpus, pairs=pairs, cpu=cpu_info()
    )
