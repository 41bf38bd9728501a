"""Pure readers for ``ceiling probe``: nvidia-smi text and NVML values -> the topology nouns.

Nothing here talks to a driver or runs a command: ``topology`` does the NVML / nvidia-smi / sysfs
calls and hands the raw text and numbers to these functions, so each one is testable on recorded
output (tests/fixtures/probe). The pair connection is NVIDIA's own vocabulary (NV#, PIX, PXB,
PHB, NODE, SYS); :func:`link_kind` maps it onto the link kinds that ``predict`` knows (nvlink,
pcie5-switch, pcie5-host, pcie5-cross-socket, ...), because that is the question a decode step
asks: what does each allreduce cross? Catalog look-ups (GPU names, link kinds, PCIe rates) read
the data files under ``ceiling/data``.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from pydantic import Field

from ceiling.errors import CeilingError
from ceiling.probe.topology_model import CpuInfo, GpuInfo, GpuPair, Topology
from ceiling.spec._data import DataModel, load_yaml
from ceiling.spec.hardware import list_links, load_gpu

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
CONNECTION = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")

# nvmlGpuTopologyLevel_t -> nvidia-smi's code
NVML_ANCESTOR = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# nvmlGpuP2PStatus_t -> its name (NVML_P2P_STATUS_OK is 0)
NVML_P2P_STATUS = {
    0: "OK",
    1: "CHIPSET_NOT_SUPPORTED",
    2: "GPU_NOT_SUPPORTED",
    3: "IOH_TOPOLOGY_NOT_SUPPORTED",
    4: "DISABLED_BY_REGKEY",
    5: "NOT_SUPPORTED",
    6: "UNKNOWN",
}
NVML_P2P_OK = 0

SMI_FIELDS = (
    "index,name,uuid,pci.bus_id,memory.total,clocks.max.sm,clocks.max.memory,"
    "pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,"
    "driver_version"
)

_PCIE_PLACE = {
    "PIX": "switch",
    "PXB": "switch",
    "PHB": "host",
    "NODE": "host",
    "SYS": "cross-socket",
}


# --------------------------------------------------------------------------- catalog look-ups


class PcieGeneration(DataModel):
    gt_per_s: float
    encoding: float = Field(gt=0, le=1, description="line-code efficiency (128b/130b: 0.9846)")


class PcieFile(DataModel):
    """``data/pcie.yaml``: per-lane transfer rate and encoding of each PCIe generation."""

    schema_version: int
    generations: dict[int, PcieGeneration]


@cache
def _pcie_table() -> dict[int, PcieGeneration]:
    return load_yaml("pcie.yaml", schema=PcieFile).generations


def pcie_GBps(gen: int | None, width: int | None) -> float | None:
    """Theoretical per-direction bandwidth of a PCIe link (data/pcie.yaml)."""
    if not gen or not width:
        return None
    row = _pcie_table().get(int(gen))
    if row is None:
        return None
    return round(row.gt_per_s * row.encoding / 8 * width, 2)


@cache
def _catalog_links() -> frozenset[str]:
    """Link names predict's catalog knows (empty if the catalog is not available)."""
    try:
        return frozenset(link.name for link in list_links())
    except CeilingError:  # a broken install's catalog: no link name is known
        return frozenset()


def catalog_gpu(raw_name: str) -> str | None:
    """The catalog name of a GPU the driver calls e.g. 'NVIDIA H200' (None if unknown)."""
    words = re.sub(r"^nvidia\s+", "", raw_name.strip().lower()).replace("_", " ").split()
    for n in range(len(words), 0, -1):
        try:
            return load_gpu("-".join(words[:n])).name
        except CeilingError:  # not a catalog name: try a shorter one
            continue
    return None


def nvlink_kind(gpu_catalog_name: str | None) -> str:
    try:
        return (load_gpu(gpu_catalog_name).nvlink if gpu_catalog_name else None) or "nvlink"
    except CeilingError:
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


def common_gen(gpus: list[GpuInfo]) -> int | None:
    """The PCIe generation every GPU reaches (the slowest card's max)."""
    gens = [g.pcie_gen_max for g in gpus if g.pcie_gen_max]
    return min(gens) if gens else None


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
            if not CONNECTION.match(code):
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


def parse_smi_query(text: str) -> list[GpuInfo]:
    """Parse ``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits``."""
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


def smi_driver_version(query_text: str) -> str | None:
    """The driver version: the last field of the query's first row."""
    rows = query_text.strip().splitlines()
    return (rows[0].split(",")[-1].strip() or None) if rows else None


def _int(s: str | None) -> int | None:
    if s is None:
        return None
    try:
        return int(float(s))
    except ValueError:
        return None


def topology_from_smi_text(
    gpus: list[GpuInfo],
    topo_text: str,
    p2p_text: str | None,
    driver: str | None = None,
    cpu: CpuInfo | None = None,
) -> Topology:
    """Build a Topology from nvidia-smi outputs (the fallback path when NVML is missing)."""
    topo = parse_topo_matrix(topo_text)
    p2p = parse_topo_matrix(p2p_text) if p2p_text else None
    for g in gpus:
        aff = topo["affinity"].get(f"GPU{g.index}", {})
        g.cpu_affinity = aff.get("CPU Affinity")
        g.numa_node = _int(aff.get("NUMA Affinity", ""))
    nvl = nvlink_kind(gpus[0].catalog_name) if gpus else "nvlink"
    pairs = pairs_from_matrix(topo, p2p, common_gen(gpus), nvl)
    for pr in pairs:
        if pr.nvlinks:
            for idx in (pr.a, pr.b):
                end = next((x for x in gpus if x.index == idx), None)
                if end is not None:
                    end.nvlink_active_links = max(end.nvlink_active_links or 0, pr.nvlinks)
    return Topology(
        source="nvidia-smi", driver_version=driver, gpus=gpus, pairs=pairs, cpu=cpu or CpuInfo()
    )


def prefer_smi_connections(topo: Topology, topo_text: str, gen: int | None, nvl: str) -> None:
    """Take ``nvidia-smi topo -m``'s connection code where NVML's reading differs (in place).

    nvidia-smi is what users compare against, and it knows NVSwitch and VM quirks that the
    common-ancestor query can miss; the disagreement is kept as a note.
    """
    parsed = parse_topo_matrix(topo_text)
    for pr in topo.pairs:
        code = parsed["matrix"].get((f"GPU{pr.a}", f"GPU{pr.b}"))
        if code and CONNECTION.match(code) and code != pr.connection:
            topo.notes.append(
                f"GPU{pr.a}-GPU{pr.b}: NVML reads {pr.connection}, nvidia-smi topo -m says "
                f"{code}; using nvidia-smi"
            )
            pr.connection = code
            pr.nvlinks = int(code[2:]) if code.startswith("NV") else 0
            pr.link = link_kind(code, gen, pr.p2p, nvl)


# --------------------------------------------------------------------------- NVML values


def cuda_version(v: int | None) -> str | None:
    """``nvmlSystemGetCudaDriverVersion``'s integer (13000) as text (13.0)."""
    return None if not v else f"{v // 1000}.{(v % 1000) // 10}"


def gpu_from_nvml(
    index: int,
    name: str,
    *,
    uuid: str | None = None,
    pci_bus_id: str | None = None,
    memory_total_bytes: int | None = None,
    sm_clock_max_MHz: int | None = None,
    mem_clock_max_MHz: int | None = None,
    pcie_gen_current: int | None = None,
    pcie_gen_max: int | None = None,
    pcie_width_current: int | None = None,
    pcie_width_max: int | None = None,
    nvlinks_active: int | None = None,
    numa_node: int | None = None,
) -> GpuInfo:
    """One GPU from NVML's readings (None: the query failed or is not supported)."""
    return GpuInfo(
        index=index,
        name=name,
        catalog_name=catalog_gpu(name),
        uuid=uuid,
        pci_bus_id=pci_bus_id,
        memory_total_GiB=None
        if memory_total_bytes is None
        else round(memory_total_bytes / 2**30, 2),
        sm_clock_max_MHz=sm_clock_max_MHz,
        mem_clock_max_MHz=mem_clock_max_MHz,
        pcie_gen_current=pcie_gen_current,
        pcie_gen_max=pcie_gen_max,
        pcie_width_current=pcie_width_current,
        pcie_width_max=pcie_width_max,
        pcie_GBps_per_direction=pcie_GBps(pcie_gen_max, pcie_width_max),
        nvlink_active_links=nvlinks_active,
        numa_node=numa_node,
    )


def pair_from_nvml(
    a: GpuInfo,
    b: GpuInfo,
    *,
    nvlinks_to_peer: int,
    nvlink_p2p_ok: bool,
    ancestor: int | None,
    p2p_read_status: int | None,
    pcie_gen: int | None,
    nvlink: str = "nvlink",
) -> GpuPair:
    """One GPU pair from NVML's readings.

    ``nvlinks_to_peer``: links of ``a`` whose remote PCI address is ``b``. On NVSwitch boards
    the links end at switches, not at the peer, yet NVML says the pair does P2P over NVLink
    (``nvlink_p2p_ok``): the pair then counts the GPUs' active links. Otherwise the PCIe common
    ancestor (``nvmlGpuTopologyLevel_t``) gives nvidia-smi's code; ``p2p_read_status`` is the
    ``nvmlGpuP2PStatus_t`` of P2P reads (None: the query failed).
    """
    nv = nvlinks_to_peer
    if not nv and nvlink_p2p_ok:
        nv = min(a.nvlink_active_links or 0, b.nvlink_active_links or 0)
    code = f"NV{nv}" if nv else NVML_ANCESTOR.get(-1 if ancestor is None else ancestor, "SYS")
    ok = None if p2p_read_status is None else p2p_read_status == NVML_P2P_OK
    return GpuPair(
        a=a.index,
        b=b.index,
        connection=code,
        nvlinks=nv,
        p2p=ok,
        p2p_status=None
        if p2p_read_status is None
        else NVML_P2P_STATUS.get(p2p_read_status, str(p2p_read_status)),
        link=link_kind(code, pcie_gen, ok, nvlink),
    )
