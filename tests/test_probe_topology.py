"""probe: the pure readers (nvidia-smi text, NVML values -> nouns), the NVML path (with a fake
NVML), the no-GPU path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ceiling.probe import nvml, topology
from ceiling.probe.topology import cpu_info
from ceiling.probe.topology_model import GpuInfo, GpuPair, Topology
from ceiling.probe.topology_parse import (
    cuda_version,
    gpu_from_nvml,
    link_kind,
    pair_from_nvml,
    parse_smi_query,
    parse_topo_matrix,
    pcie_GBps,
    prefer_smi_connections,
    smi_driver_version,
    topology_from_smi_text,
)
from ceiling.spec.hardware import list_links

FIX = Path(__file__).parent / "fixtures" / "probe"


def _read(name: str) -> str:
    return (FIX / name).read_text()


def test_real_h200_single_gpu_topo_has_no_pairs_and_keeps_affinity():
    parsed = parse_topo_matrix(_read("topo_m_h200_1gpu.txt"))
    assert parsed["devices"] == ["GPU0"]
    assert parsed["matrix"][("GPU0", "GPU0")] == "X"
    assert parsed["affinity"]["GPU0"]["CPU Affinity"] == "0-15"
    assert parsed["affinity"]["GPU0"]["NUMA Affinity"] == "0"


def test_pcie_box_pairs_links_and_p2p():
    gpus = parse_smi_query(_read("smi_query_8x_pcie.csv"))
    assert len(gpus) == 8
    assert gpus[0].catalog_name == "rtx-pro-6000"
    assert gpus[0].pcie_gen_current == 1 and gpus[0].pcie_gen_max == 5
    assert gpus[0].pcie_GBps_per_direction == pytest.approx(63.02, abs=0.01)
    topo = topology_from_smi_text(
        gpus, _read("topo_m_8x_pcie.txt"), _read("topo_p2p_r_8x_pcie.txt"), driver="580.95.05"
    )
    assert topo.source == "nvidia-smi"
    assert len(topo.pairs) == 28  # 8 choose 2; the NIC row/column is not a GPU pair
    by = {(p.a, p.b): p for p in topo.pairs}
    assert by[(0, 1)].connection == "PIX" and by[(0, 1)].link == "pcie5-switch"
    assert by[(0, 2)].connection == "NODE" and by[(0, 2)].link == "pcie5-host"
    assert by[(3, 4)].connection == "SYS" and by[(3, 4)].p2p is False
    assert by[(0, 1)].p2p is True
    assert topo.gpus[5].numa_node == 1 and topo.gpus[5].cpu_affinity == "32-63,96-127"
    # a ring over GPUs 0-3 crosses host bridges; over all 8 it crosses the sockets
    assert topo.link_for([0, 1]) == "pcie5-switch"
    assert topo.link_for([0, 1, 2, 3]) == "pcie5-host"
    assert topo.link_for(list(range(8))).startswith("pcie5-cross-socket")


def test_nvlink_box_maps_to_the_gpus_nvlink_generation():
    gpus = parse_smi_query(_read("smi_query_8x_h100.csv"))
    topo = topology_from_smi_text(gpus, _read("topo_m_8x_nvlink.txt"), None)
    assert {p.connection for p in topo.pairs} == {"NV18"}
    assert {p.link for p in topo.pairs} == {"nvlink4"}
    assert all(p.nvlinks == 18 for p in topo.pairs)
    assert topo.gpus[0].nvlink_active_links == 18
    assert all(p.p2p is None for p in topo.pairs)  # no p2p matrix given: unknown, not "yes"


def test_smi_driver_version_and_cuda_version_text():
    assert smi_driver_version(_read("smi_query_8x_pcie.csv")) == "580.95.05"
    assert smi_driver_version("") is None
    assert cuda_version(13000) == "13.0" and cuda_version(12040) == "12.4"
    assert cuda_version(None) is None and cuda_version(0) is None


def _h200(index: int, links: int | None) -> GpuInfo:
    return gpu_from_nvml(
        index,
        "NVIDIA H200",
        memory_total_bytes=150_754_820_096,  # what NVML reports for an H200 (140.4 GiB)
        pcie_gen_max=5,
        pcie_width_max=16,
        nvlinks_active=links,
    )


def test_gpu_from_nvml_values():
    g = _h200(1, 18)
    assert (g.index, g.catalog_name, g.memory_total_GiB) == (1, "h200", 140.4)
    assert g.pcie_GBps_per_direction == pytest.approx(63.02, abs=0.01)
    assert g.nvlink_active_links == 18
    unknown = gpu_from_nvml(0, "NVIDIA Nonesuch 9000")  # every query failed but the name
    assert unknown.catalog_name is None and unknown.memory_total_GiB is None
    assert unknown.pcie_GBps_per_direction is None


def test_pair_from_nvml_values():
    a, b = _h200(0, 18), _h200(1, 18)
    # NVSwitch (HGX): no link ends at the peer, NVML says P2P over NVLink works
    sw = pair_from_nvml(
        a, b, nvlinks_to_peer=0, nvlink_p2p_ok=True, ancestor=50, p2p_read_status=0, pcie_gen=5
    )
    assert (sw.connection, sw.nvlinks, sw.p2p, sw.p2p_status) == ("NV18", 18, True, "OK")
    direct = pair_from_nvml(
        a, b, nvlinks_to_peer=4, nvlink_p2p_ok=False, ancestor=50, p2p_read_status=0, pcie_gen=5
    )
    assert (direct.connection, direct.nvlinks) == ("NV4", 4)
    # PCIe only: the common ancestor names the connection; P2P refused -> the -nop2p link kind
    pcie_a, pcie_b = _h200(0, None), _h200(1, None)
    sw_pcie = pair_from_nvml(
        pcie_a,
        pcie_b,
        nvlinks_to_peer=0,
        nvlink_p2p_ok=False,
        ancestor=10,
        p2p_read_status=5,
        pcie_gen=5,
    )
    assert (sw_pcie.connection, sw_pcie.p2p, sw_pcie.p2p_status) == ("PIX", False, "NOT_SUPPORTED")
    assert sw_pcie.link == "pcie5-switch-nop2p"
    unknown = pair_from_nvml(
        pcie_a,
        pcie_b,
        nvlinks_to_peer=0,
        nvlink_p2p_ok=False,
        ancestor=None,
        p2p_read_status=None,
        pcie_gen=None,
    )
    assert (unknown.connection, unknown.p2p, unknown.p2p_status) == ("SYS", None, None)


def test_nvidia_smi_matrix_overrides_nvml_pairs_on_recorded_text():
    pairs = [
        GpuPair(a=0, b=1, connection="SYS", p2p=True, link="pcie5-cross-socket"),
        GpuPair(a=2, b=3, connection="NV18", nvlinks=18, p2p=True, link="nvlink4"),
    ]
    topo = Topology(source="nvml", pairs=pairs)
    prefer_smi_connections(topo, _read("topo_m_8x_nvlink.txt"), 5, "nvlink4")
    assert (pairs[0].connection, pairs[0].nvlinks, pairs[0].link) == ("NV18", 18, "nvlink4")
    assert topo.notes == [
        "GPU0-GPU1: NVML reads SYS, nvidia-smi topo -m says NV18; using nvidia-smi"
    ]
    prefer_smi_connections(topo, "", 5, "nvlink4")  # nvidia-smi printed nothing: no change
    assert len(topo.notes) == 1


def test_link_names_exist_in_predicts_catalog():
    known = {link.name for link in list_links()}
    for code in ("PIX", "PXB", "PHB", "NODE", "SYS"):
        assert link_kind(code, 5) in known
        assert link_kind(code, 4) in known
    assert link_kind("PIX", 5, p2p=False) == "pcie5-switch-nop2p"
    for gen in (4, 5):  # with P2P off, the catalog's -nop2p kind of that generation
        nop2p = link_kind("PIX", gen, p2p=False)
        assert nop2p in known and "nop2p" in nop2p


def test_pcie_bandwidth_from_data_file():
    assert pcie_GBps(4, 16) == pytest.approx(31.51, abs=0.01)
    assert pcie_GBps(5, 8) == pytest.approx(31.51, abs=0.01)
    assert pcie_GBps(None, 16) is None
    assert pcie_GBps(99, 16) is None


def test_cpu_info_from_a_sysfs_tree(tmp_path):
    for n, cpus in ((0, "0-3"), (1, "4-7")):
        d = tmp_path / f"devices/system/node/node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    for c in range(8):
        d = tmp_path / f"devices/system/cpu/cpu{c}/topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(str(c // 4))
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\n")
    info = cpu_info(str(tmp_path), str(cpuinfo))
    assert info.sockets == 2
    assert [(n.node, n.cpus) for n in info.numa_nodes] == [(0, "0-3"), (1, "4-7")]
    assert info.model == "Test CPU 9000"


@pytest.fixture
def no_nvml(monkeypatch):
    nvml.reset_for_tests()
    monkeypatch.setattr(nvml, "open_nvml", lambda: (None, "NVML not here (test)"))
    monkeypatch.setattr(topology.shutil, "which", lambda _name: None)
    yield
    nvml.reset_for_tests()


def test_probe_without_gpus_is_a_cpu_only_description(no_nvml):
    topo = topology.probe()
    assert topo.gpus == [] and topo.pairs == []
    assert topo.source == "none"
    assert "NVML not here" in topo.reason and "nvidia-smi not found" in topo.reason
    assert topo.cpu.logical_cpus


def test_cli_probe_json_without_gpus_exits_zero():
    """In a fresh process on this GPU-less machine: exit 0, gpus: []."""
    proc = subprocess.run(
        [sys.executable, "-m", "ceiling", "probe", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "NVIDIA" in proc.stdout and '"gpus": []' not in proc.stdout:
        pytest.skip("this machine has an NVIDIA GPU")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["gpus"] == [] and data["schema_version"] == 1


class FakeNVML:
    """Two GPUs behind one PCIe switch (PIX), P2P OK, no NVLink; one GPU's power query fails."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    NVML_P2P_CAPS_INDEX_READ = 0
    NVML_P2P_STATUS_OK = 0
    NVML_NVLINK_MAX_LINKS = 4

    def nvmlSystemGetDriverVersion(self):
        return b"580.1"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H200"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=141 * 2**30)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 1

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=f"00000000:{h + 1:02d}:00.0".encode())

    def nvmlDeviceGetMaxClockInfo(self, h, which):
        return 1980 if which == 1 else 3201

    def nvmlDeviceGetNvLinkState(self, h, link):
        raise RuntimeError("Not Supported")

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return 10  # NVML_TOPOLOGY_SINGLE = PIX

    def nvmlDeviceGetP2PStatus(self, a, b, idx):
        return 0 if idx == self.NVML_P2P_CAPS_INDEX_READ else 5  # PCIe P2P yes, NVLink no


def test_nvml_path_with_a_fake_library(monkeypatch):
    nvml.reset_for_tests()
    monkeypatch.setattr(nvml, "open_nvml", lambda: (FakeNVML(), None))
    topo = topology.probe()
    nvml.reset_for_tests()
    assert topo.source == "nvml" and topo.driver_version == "580.1"
    assert topo.cuda_driver_version == "13.0"
    assert [g.catalog_name for g in topo.gpus] == ["h200", "h200"]
    assert all(g.nvlink_active_links is None for g in topo.gpus)  # "Not Supported" -> None
    assert topo.gpus[0].pcie_GBps_per_direction == pytest.approx(63.02, abs=0.01)
    (pair,) = topo.pairs
    assert (pair.connection, pair.p2p, pair.link) == ("PIX", True, "pcie5-switch")


def test_gpu_info_is_plain_json():
    g = GpuInfo(index=0, name="x")
    assert json.loads(g.model_dump_json())["name"] == "x"


class FakeNVSwitch(FakeNVML):
    """Two H200s whose 18 NVLinks all end at NVSwitches (HGX): no link reaches the peer's PCI
    address, yet the pair does P2P over NVLink."""

    NVML_P2P_CAPS_INDEX_NVLINK = 3
    NVML_NVLINK_MAX_LINKS = 18

    def nvmlDeviceGetNvLinkState(self, h, link):
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=b"00000000:AA:00.0")  # a switch

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return 50  # SYS over PCIe

    def nvmlDeviceGetP2PStatus(self, a, b, idx):
        return 0  # P2P over PCIe and over NVLink


def test_nvswitch_pairs_are_nvlink(monkeypatch):
    nvml.reset_for_tests()
    monkeypatch.setattr(nvml, "open_nvml", lambda: (FakeNVSwitch(), None))
    monkeypatch.setattr(topology.shutil, "which", lambda _name: None)
    topo = topology.probe()
    nvml.reset_for_tests()
    assert [g.nvlink_active_links for g in topo.gpus] == [18, 18]
    (pair,) = topo.pairs
    assert (pair.connection, pair.nvlinks, pair.link) == ("NV18", 18, "nvlink4")


def test_nvidia_smi_wins_where_nvml_disagrees(monkeypatch):
    nvml.reset_for_tests()
    monkeypatch.setattr(nvml, "open_nvml", lambda: (FakeNVML(), None))  # NVML reads PIX
    monkeypatch.setattr(topology.shutil, "which", lambda _name: "/usr/bin/nvidia-smi")
    smi = "GPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-7\nGPU1\tNV4\t X \t0-7\n"
    monkeypatch.setattr(topology, "_run", lambda args: smi)
    topo = topology.probe()
    nvml.reset_for_tests()
    (pair,) = topo.pairs
    assert (pair.connection, pair.nvlinks, pair.link) == ("NV4", 4, "nvlink4")
    assert any("nvidia-smi topo -m says NV4" in n for n in topo.notes)
