"""The nouns of ``ceiling env``: what the inspected environment has, and what is wrong with it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, computed_field

SCHEMA_VERSION = 1


class EnvProblem(BaseModel):
    """One incompatibility: what, the evidence read from the environment, the exact fix."""

    level: Literal["error", "warning", "info"]
    kind: str
    subject: str
    what: str
    evidence: list[str] = Field(default_factory=list)
    fix: str | None = None


class Dist(BaseModel):
    """One installed distribution, as the environment's own importlib.metadata reports it."""

    name: str
    version: str
    requires: list[str] = Field(default_factory=list)
    location: str
    binaries: list[str] = Field(default_factory=list)  # shared objects (paths in ``location``)


class Inventory(BaseModel):
    """What ``envcheck/data/probe_env.py inventory`` reads inside the checked Python."""

    python: str
    prefix: str
    version: str
    markers: dict[str, str]
    dists: list[Dist]
    torch: dict[str, str | None] | None = None
    ext_suffixes: list[str] = Field(default_factory=list)


class LoadResult(BaseModel):
    """One binary loaded in the checked Python (after ``import torch``)."""

    path: str
    ok: bool
    error: str | None = None


class TorchRuntime(BaseModel):
    """What the imported torch says about itself (``load`` step)."""

    imported: bool = False
    version: str | None = None
    cuda: str | None = None
    arch_flags: list[str] = Field(default_factory=list)
    nccl_version: str | None = None
    nccl_error: str | None = None
    nccl_loaded: list[str] = Field(default_factory=list)
    cudart_loaded: list[str] = Field(default_factory=list)
    error: str | None = None


class Gpu(BaseModel):
    index: int
    name: str
    capability: int  # 90 for compute capability 9.0, 120 for 12.0


class Driver(BaseModel):
    """The NVIDIA driver of this host (absent on a CPU-only host)."""

    version: str | None = None  # kernel module, e.g. 570.124.06
    cuda: str | None = None  # the newest CUDA runtime it supports, e.g. 12.8 (cuDriverGetVersion)


class EnvReport(BaseModel):
    """The verdict on one Python environment and the host it runs on."""

    schema_version: int = SCHEMA_VERSION
    python: str
    python_version: str | None = None
    engines: list[str] = Field(default_factory=list)
    torch_version: str | None = None
    torch_cuda: str | None = None
    torch_runtime: TorchRuntime | None = None
    driver: Driver = Field(default_factory=Driver)
    gpus: list[Gpu] = Field(default_factory=list)
    tp: int = 1
    dists_checked: int = 0
    binaries_checked: int = 0
    binaries_cached: bool = False
    checks: list[str] = Field(default_factory=list)
    problems: list[EnvProblem] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    elapsed_s: float = 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        return not any(p.level == "error" for p in self.problems)

    def summary(self) -> dict[str, object]:
        """The report as JSON data (``ok`` included)."""
        return self.model_dump(mode="json")
