"""Hardware catalog and deployment rules (engine allreduce choice, KV dtype)."""

from __future__ import annotations

import pytest

from ceiling.errors import CeilingError
from ceiling.spec.deployment import Deployment
from ceiling.spec.hardware import list_gpus, list_links, load_gpu, load_link

REQUIRED_GPUS = {
    "rtx-pro-6000",
    "h100-sxm",
    "h100-pcie",
    "h200",
    "b200",
    "a100-80",
    "l40s",
    "rtx-4090",
    "rtx-3090",
}


def test_catalog_has_required_gpus_with_sources():
    gpus = {g.name: g for g in list_gpus()}
    assert set(gpus) >= REQUIRED_GPUS
    for g in gpus.values():
        assert g.source and g.mem_bw_GBps > 0 and "bf16" in g.tflops


def test_facts_from_hardware_facts_md():
    g = load_gpu("rtx-pro-6000")
    assert (g.memory_GiB, g.mem_bw_GBps, g.nvlink) == (96, 1792, None)
    assert load_gpu("h200").mem_bw_GBps == 4800
    assert load_gpu("a100").name == "a100-80"  # alias


def test_links_cover_kinds_and_p2p():
    links = {lk.name: lk for lk in list_links()}
    kinds = {lk.kind for lk in links.values()}
    assert {"nvlink", "pcie-switch", "pcie-host", "pcie-cross-socket"} <= kinds
    assert links["pcie5-switch"].p2p and not links["pcie5-switch-nop2p"].p2p
    assert links["pcie5-switch-nop2p"].oneshot is None  # no P2P, no one-shot kernel
    assert all(lk.source for lk in links.values())


def test_unknown_gpu_and_link():
    with pytest.raises(CeilingError, match="unknown GPU"):
        load_gpu("tpu-v5")
    with pytest.raises(CeilingError, match="unknown link"):
        load_link("carrier-pigeon")


@pytest.mark.parametrize(
    ("engine", "tp", "link", "expected"),
    [
        ("vllm", 8, "pcie5-switch", "nccl"),  # > 2 PCIe-only GPUs: custom AR disabled
        ("vllm", 2, "pcie5-switch", "oneshot"),
        ("vllm", 8, "nvlink4", "oneshot"),
        ("vllm", 2, "pcie5-switch-nop2p", "nccl"),  # no P2P
        ("vllm", 3, "nvlink4", "nccl"),  # unsupported world size
        ("generic", 8, "nvlink4", "nccl"),
        ("trtllm", 2, "pcie5-switch", "nccl"),
        ("vllm", 1, "pcie5-switch", "none"),
    ],
)
def test_auto_allreduce_follows_engine_rule(engine, tp, link, expected):
    impl, reason = Deployment(engine=engine, tp=tp).resolve_allreduce(load_link(link))
    assert impl == expected, reason


def test_forced_oneshot_without_p2p_is_an_error():
    with pytest.raises(CeilingError, match="P2P"):
        Deployment(tp=4, allreduce="oneshot").resolve_allreduce(load_link("pcie5-switch-nop2p"))


def test_kv_dtype():
    assert Deployment(kv_dtype="fp8").kv_elem_bytes(None)[0] == 1.0
    b, why = Deployment().kv_elem_bytes("fp8")
    assert b == 2.0 and "fp8" in why
    with pytest.raises(CeilingError, match="KV dtype"):
        Deployment(kv_dtype="int3").kv_elem_bytes(None)
