"""This box as a GPU box for the doctor's setup check: ``probe`` answers ``n`` GPUs (the
stand-in servers of the GPU-path tests then run "on" them; nothing touches NVML)."""

from __future__ import annotations

import pytest

from ceiling.probe.topology_model import GpuInfo, Topology


def gpu_box(n: int, name: str = "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            catalog: str | None = "rtx-pro-6000") -> Topology:  # fmt: skip
    if n == 0:
        return Topology(source="none", reason="no NVIDIA GPU: NVML sees no GPU")
    gpus = [GpuInfo(index=i, name=name, catalog_name=catalog) for i in range(n)]
    return Topology(source="nvml", gpus=gpus)


def use_gpu_box(monkeypatch: pytest.MonkeyPatch, topo: Topology) -> None:
    """Every probe the doctor makes (its setup check, its hardware stage) sees ``topo``."""
    monkeypatch.setattr("ceiling.flows.setup_seen.probe", lambda: topo)
    monkeypatch.setattr("ceiling.flows.hardware.probe", lambda: topo)
