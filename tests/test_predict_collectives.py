"""The collective model against published small-message allreduce latencies.

Modelled rows: allreduce_points.csv on flat PCIe-switch boxes (RTX PRO 6000 Gen5, V100 Gen3),
NVLink (A100) and dual-socket direct attach, NCCL default or one-shot custom kernels, messages
up to 1 MB (decode sends B x hidden x 2 bytes: 14 KB at B=1 for hidden 7168).
Excluded, with reasons:
- A012: NCCL 64 KB point 71.2 us is non-monotonic (128 KB is 24.7 us), flagged in the source.
- A033-A040: 8 GPUs over two switches across sockets with a posted-write collapse bug (source).
- A053-A070: a three-level switch hierarchy (WRX90 + 3 c-payne switches): a topology the
  flat-switch link does not describe (NCCL 2.3x slower at 4 GPUs than the flat switch).
- A072/A074/A076/A078 (forced XML graph), A091-A097 (fused allreduce+add), A110-A121
  (hierarchical b12x / 16 GPUs): implementations the model does not have.
Tolerance: median |error| <= 20 %, every modelled row within 65 %.
"""

from __future__ import annotations

import csv
import statistics
from importlib import resources

from ceiling.predict.collectives import allreduce_us, alltoall_us, send_us
from ceiling.spec.hardware import load_link

EXCLUDED = {"A012", *(f"A0{i}" for i in range(33, 41)), *(f"A0{i}" for i in range(53, 71))}


def _classify(row: dict[str, str]) -> tuple[str, str] | None:
    ic, impl = row["interconnect"].lower(), row["implementation"].lower()
    if row["id"] in EXCLUDED or int(row["message_bytes"]) > 1_048_576:
        return None
    if any(k in impl for k in ("b12x", "hierarchical", "xml", "residual", "fused", "4+4")):
        return None
    if "v100" in row["gpu"].lower():
        link = "pcie3-switch"
    elif "nvlink" in ic:
        link = "nvlink3"
    elif "direct-attach" in ic and "dual-socket" in ic:
        link = "pcie5-cross-socket"
    elif "pcie-gen5-switch" in ic:
        link = "pcie5-switch"
    else:
        return None
    if impl.startswith("nccl"):
        return link, "nccl"
    if "custom" in impl or "oneshot" in impl or "one-shot" in impl:
        return link, "oneshot"
    return None


def _errors() -> list[tuple[str, float]]:
    path = resources.files("ceiling") / "data" / "predict" / "reference" / "allreduce_points.csv"
    out = []
    for row in csv.DictReader(path.open()):
        c = _classify(row)
        if c is None:
            continue
        link, impl = c
        pred = allreduce_us(load_link(link), impl, int(row["num_gpus"]), int(row["message_bytes"]))
        meas = float(row["latency_us"])
        out.append((row["id"], (pred - meas) / meas * 100))
    return out


def test_allreduce_model_against_published_points():
    errs = _errors()
    assert len(errs) >= 60
    abs_err = [abs(e) for _, e in errs]
    assert statistics.median(abs_err) <= 20, errs
    worst = max(errs, key=lambda x: abs(x[1]))
    assert abs(worst[1]) <= 65, worst


def test_decode_message_on_8_pcie_gpus_about_24us_nccl_11us_oneshot():
    link = load_link("pcie5-switch")
    nccl = allreduce_us(link, "nccl", 8, 14336)
    oneshot = allreduce_us(link, "oneshot", 8, 14336)
    assert 20 <= nccl <= 28
    assert 8 <= oneshot <= 12  # published: 9.2 us at 8 KB, 16.5 us at 32 KB (A045, A047)


def test_latency_grows_with_ranks_and_bytes_and_without_p2p():
    link = load_link("pcie5-switch")
    assert allreduce_us(link, "nccl", 8, 14336) > allreduce_us(link, "nccl", 4, 14336)
    assert allreduce_us(link, "nccl", 8, 1 << 20) > allreduce_us(link, "nccl", 8, 14336)
    nop2p = load_link("pcie5-switch-nop2p")
    assert allreduce_us(nop2p, "nccl", 8, 14336) > allreduce_us(link, "nccl", 8, 14336)
    assert allreduce_us(link, "nccl", 1, 14336) == 0.0


def test_nvlink_is_faster_than_pcie():
    assert allreduce_us(load_link("nvlink4"), "nccl", 8, 14336) < allreduce_us(
        load_link("pcie5-switch"), "nccl", 8, 14336
    )


def test_alltoall_and_send_positive():
    link = load_link("pcie5-switch")
    assert alltoall_us(link, 8, 8 * 7168 * 2) > alltoall_us(link, 8, 7168 * 2) > 0
    assert send_us(link, 14336) > link.p2p_us


def test_profile_fit_prefers_default_settings_and_matching_graph_mode():
    """A commbench profile lists tuning variants and eager fits too; the deployment (default
    NCCL, CUDA graphs on) must be described by the default graph fit at its world size."""
    from ceiling.predict.collectives import _profile_fit
    from ceiling.spec.profile import CollectiveFit, HardwareProfile

    def fit(alpha, n, graph, env=None):
        return CollectiveFit(
            world_size=n, alpha_us=alpha, beta_GBps=100, in_cuda_graph=graph, env=env or {}
        )

    prof = HardwareProfile(
        collectives=[
            fit(50, 8, False, {"NCCL_ALGO": "Tree"}),
            fit(40, 8, False),
            fit(30, 8, True, {"NCCL_PROTO": "LL", "NCCL_NVLS_ENABLE": "0"}),
            fit(20, 8, True, {"NCCL_NVLS_ENABLE": "0"}),
            fit(10, 4, True),
            fit(5, 1, True),
        ]
    )
    assert _profile_fit(prof, "nccl", 8, in_cuda_graph=True).alpha_us == 20
    assert _profile_fit(prof, "nccl", 8, in_cuda_graph=False).alpha_us == 40
    assert _profile_fit(prof, "nccl", 4, in_cuda_graph=True).alpha_us == 10
    assert _profile_fit(prof, "nccl", 2, in_cuda_graph=True).alpha_us == 10  # nearest, never n=1
    assert _profile_fit(prof, "oneshot", 8) is None
