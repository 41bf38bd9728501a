"""Hardware: the GPU and the link between GPUs, from the catalog data files; and
:data:`Hardware`, the one noun ``predict`` takes for "what runs the model": GPUs of one box
(:class:`GpuHardware`) or a CPU (:class:`CpuHardware`).

Numbers come from ``data/gpus.yaml`` and ``data/links.yaml`` (datasheets, published
measurements, each with its source). A measured :class:`~ceiling.spec.profile.HardwareProfile`
(``predict --profile``) overrides any of them.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError, model_validator

from ceiling.errors import CeilingError
from ceiling.inputs import read_text
from ceiling.spec._data import load_yaml


class GPU(BaseModel):
    """A GPU model (``data/gpus.yaml`` entry, or a user's GPU file: unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    full_name: str = ""
    arch: str
    sm: int = Field(0, description="CUDA compute capability x10 (0: not NVIDIA)")
    memory_GiB: float
    memory_type: str = "hbm"
    mem_bw_GBps: float = Field(description="datasheet bandwidth")
    measured_bw_GBps: float | None = Field(None, description="achieved weight-read bandwidth")
    l2_MiB: float = 50.0
    tflops: dict[str, float]
    nvlink: str | None = None
    pcie_gen: int = 4
    p2p_supported: bool = True
    tdp_W: float | None = None
    mem_clock_MHz: float | None = None
    aic_system: str | None = None
    aliases: list[str] = Field(default_factory=list)
    source: str = ""
    limits: dict[str, float] = Field(
        default_factory=dict, description="--power-limit / --mem-clock applied (see with_limits)"
    )

    @property
    def memory_bytes(self) -> float:
        return self.memory_GiB * 2**30

    @property
    def arch_class(self) -> str:
        """The kernel-family class: ampere | ada | hopper | blackwell | blackwell_sm120 | cdna3."""
        if self.arch == "blackwell" and self.sm >= 110:
            return "blackwell_sm120"
        return self.arch

    @property
    def clock_scale(self) -> float:
        """SM clock relative to the datasheet's (power limit), 1.0 when unlimited."""
        return float(self.limits.get("clock_scale", 1.0))

    def with_limits(self, power_limit_W: float | None, mem_clock_MHz: float | None) -> GPU:
        """This GPU under a power cap and/or another memory clock.

        - memory clock: DRAM bandwidth (datasheet and measured) scales with the clock ratio.
        - power limit: a decode step is memory-bound and draws well under the board power; the
          share a decode step needs (``DECODE_POWER_SHARE`` of TDP) is kept at full clocks, and
          below it SM clocks fall as (limit / needed)^0.8 — the exponent of the RTX PRO 6000
          power-limit sweep (local-inference-lab/rtx6kpro hardware/blackwell-power-limit-sweep.md:
          300 W of 600 W -> 0.53 of the SM clock under a tensor burn). Fixed kernel costs and
          compute peaks scale with that clock; bandwidth does not. An estimate, stated as such.
        """
        data = self.model_dump()
        limits: dict[str, float] = {}
        if mem_clock_MHz is not None:
            if not self.mem_clock_MHz:
                raise CeilingError(
                    f"--mem-clock needs the default memory clock of {self.name}, which the "
                    "catalog does not have",
                    fix="add mem_clock_MHz to a --gpu FILE.yaml, or drop --mem-clock",
                )
            ratio = mem_clock_MHz / self.mem_clock_MHz
            data["mem_bw_GBps"] = self.mem_bw_GBps * ratio
            if self.measured_bw_GBps:
                data["measured_bw_GBps"] = self.measured_bw_GBps * ratio
            limits["mem_clock_MHz"] = mem_clock_MHz
            limits["mem_clock_ratio"] = ratio
        if power_limit_W is not None:
            if not self.tdp_W:
                raise CeilingError(
                    f"--power-limit needs the board power of {self.name}, which the catalog "
                    "does not have",
                    fix="add tdp_W to a --gpu FILE.yaml, or drop --power-limit",
                )
            needed = DECODE_POWER_SHARE * self.tdp_W
            scale = 1.0 if power_limit_W >= needed else (power_limit_W / needed) ** 0.8
            data["tflops"] = {k: v * scale for k, v in self.tflops.items()}
            limits["power_limit_W"] = power_limit_W
            limits["clock_scale"] = scale
        data["limits"] = limits
        return GPU.model_validate(data)

    def peak_tflops(self, compute: str) -> float:
        """Dense peak for a compute dtype; without native support the GEMM runs as w-only
        quantization (Marlin-style) in bf16, so bf16 is the fallback."""
        return self.tflops.get(compute, self.tflops["bf16"])


# Share of board power a memory-bound decode step draws (an estimate: single-stream decode on
# the RTX PRO 6000 and H100 runs at roughly half to two thirds of TDP); see GPU.with_limits.
DECODE_POWER_SHARE = 0.6


class NcclFit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_us: float
    hop_us: float
    busbw_GBps: float


class OneshotFit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_us: float
    per_rank_us: float
    ingress_GBps: float


class Link(BaseModel):
    """A link kind between GPUs (``data/links.yaml`` entry)."""

    model_config = ConfigDict(extra="forbid")

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


def _named(data: Any) -> Any:
    """A catalog's entries are keyed by name: the key is the entry's ``name``."""
    if isinstance(data, dict):
        return {n: {**e, "name": n} if isinstance(e, dict) else e for n, e in data.items()}
    return data


class GpuCatalog(RootModel[dict[str, GPU]]):
    """``data/gpus.yaml``: catalog name -> GPU."""

    @model_validator(mode="before")
    @classmethod
    def _name_entries(cls, data: Any) -> Any:
        return _named(data)


class LinkCatalog(RootModel[dict[str, Link]]):
    """``data/links.yaml``: catalog name -> link kind."""

    @model_validator(mode="before")
    @classmethod
    def _name_entries(cls, data: Any) -> Any:
        return _named(data)


def gpu_catalog() -> dict[str, GPU]:
    return load_yaml("gpus.yaml", schema=GpuCatalog).root


def _links() -> dict[str, Link]:
    return load_yaml("links.yaml", schema=LinkCatalog).root


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def load_gpu(name: str) -> GPU:
    """A GPU from the catalog by name or alias (``rtx-pro-6000``, ``h200``, ...), or a
    user-defined GPU from a YAML file (``--gpu my-gpu.yaml``, the catalog's fields)."""
    if name.endswith((".yaml", ".yml")):
        return _gpu_file(name)
    cat, key = gpu_catalog(), _key(name)
    entry = cat.get(key) or next((g for g in cat.values() if key in g.aliases), None)
    if entry is None:
        spellings = list(cat) + [a for g in cat.values() for a in g.aliases]
        close = difflib.get_close_matches(key, spellings, n=3, cutoff=0.6)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        raise CeilingError(
            f"unknown GPU '{name}'{hint}",
            fix="one of: " + ", ".join(cat) + " (see `ceiling predict --list-gpus`)",
        )
    return entry.model_copy(deep=True)  # the catalog is cached: callers get their own


def _gpu_file(path: str) -> GPU:
    p = Path(path).expanduser()
    text = read_text(p, "GPU file", fix="pass a YAML file with the GPU's fields")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CeilingError(f"{p} is not valid YAML: {exc}", fix="fix the file") from exc
    if not isinstance(data, dict):
        raise CeilingError(f"{p} must hold one mapping of GPU fields", fix="see docs/predict.md")
    if len(data) == 1 and isinstance(next(iter(data.values())), dict):
        name, data = next(iter(data.items()))  # the catalog's own shape: {name: {fields}}
        data = {"name": name, **data}
    data.setdefault("name", p.stem)
    data.setdefault("full_name", data["name"])
    data.setdefault("source", f"user-defined: {p}")
    try:
        return GPU.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(x) for x in first["loc"])
        raise CeilingError(
            f"GPU file {p}: field '{field}': {first['msg']}",
            fix="required: arch, memory_GiB, mem_bw_GBps, tflops (see docs/predict.md)",
        ) from exc


def load_link(name: str) -> Link:
    """A link kind from the catalog (``pcie5-switch``, ``nvlink4``, ...)."""
    entry = _links().get(_key(name))
    if entry is None:
        raise CeilingError(
            f"unknown link '{name}'",
            fix="one of: " + ", ".join(_links()) + " (see `ceiling predict --list-links`)",
        )
    return entry.model_copy(deep=True)


def list_gpus() -> list[GPU]:
    return [g.model_copy(deep=True) for g in gpu_catalog().values()]


def list_links() -> list[Link]:
    return [lk.model_copy(deep=True) for lk in _links().values()]


class GpuHardware(BaseModel):
    """GPUs of one box: a catalog GPU (or a ``--gpu FILE.yaml``), how many, and the link kind
    between them, as ``probe`` found them or the user named them."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["gpu"] = "gpu"
    name: str = Field(description="catalog name (else what the driver calls the GPU)")
    gpus: int = Field(1, ge=1)
    link: str | None = Field(None, description="catalog link kind (None: the GPU's default)")
    p2p: bool | None = Field(None, description="peer-to-peer on every pair (None: not probed)")
    description: str = ""

    def gpu(self) -> GPU:
        """The catalog entry (CeilingError when the name is not in the catalog)."""
        return load_gpu(self.name)


class CpuHardware(BaseModel):
    """A CPU as a decode engine sees it: the memory-read bandwidth and the matrix-multiply rate
    it achieves, measured on the spot (``ceiling.probe.cpu_host``) or assumed, and said
    which."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["cpu"] = "cpu"
    name: str
    cores: int = Field(ge=1)
    mem_bw_GBps: float = Field(gt=0, description="streaming read bandwidth")
    gflops: float = Field(gt=0, description="fp32 matrix-multiply rate")
    measured: bool
    source: str = Field(description="how the two rates were obtained")
    memory_GiB: float | None = Field(None, description="physical memory, if known")
    llc_bytes: int | None = Field(None, description="last-level cache size (sysfs), if known")
    description: str = ""
    gpu_probe: str | None = Field(None, description="why no GPU was used (the GPU probe's answer)")


#: What runs the model: ``kind`` tells which.
Hardware = Annotated[GpuHardware | CpuHardware, Field(discriminator="kind")]
