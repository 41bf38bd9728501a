"""A measured hardware profile: what ``calibrate`` and ``commbench`` write, what
``predict --profile FILE`` reads in place of datasheet numbers.

The file is plain JSON so that a user can keep it beside their results and edit it. Every field
is optional: a profile overrides only what was measured. ``schema_version`` guards the format.

One format for every engine (schema 2): what an engine's own kernels measured (``calibrate
--engine llamacpp``) is that engine's entry of the ``engine`` section, read by that engine's
predictor (``predict.llamacpp.kernels_of``); the rest is the box's, read by predict's GPU model.
Version 1 had two kinds of file under ``--profile``: the hardware profile (no ``kind``) and an
engine's kernel file (``kind: "<engine>-kernels"``); :func:`load_profile` reads both as version 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from ceiling.errors import CeilingError
from ceiling.inputs import read_json
from ceiling.outputs import write_atomic

SCHEMA_VERSION = 2


class CollectiveFit(BaseModel):
    """An alpha-beta fit of one collective, measured at one world size under one setting.

    t(bytes) = alpha_us + bytes / (beta_GBps * 1e3)   [microseconds], where beta is the
    algorithm bandwidth seen by the caller for an allreduce of ``bytes`` bytes.
    """

    collective: str = "allreduce"
    link: str | None = Field(None, description="link kind name from the catalog, if known")
    implementation: str = Field("nccl", description="nccl | oneshot | gloo | ...")
    world_size: int
    alpha_us: float
    beta_GBps: float
    in_cuda_graph: bool = False
    env: dict[str, str] = Field(default_factory=dict, description="NCCL_* settings of this run")
    points: list[tuple[int, float]] = Field(
        default_factory=list, description="(message bytes, median latency us) that were fitted"
    )


class OpFit(BaseModel):
    """A kernel family's latency on this box: ``t = t0_us + bytes / (bw_GBps * 1e3)`` [us].

    Written by ``ceiling calibrate --ops`` (per-op microbenchmarks at decode shapes); predict
    uses it in place of tables and priors for ops of that family (source ``profile``).
    """

    family: str = Field(description="kernel family name (data/predict/kernels.yaml)")
    t0_us: float
    bw_GBps: float = Field(0.0, description="0: fixed cost only (bandwidth from elsewhere)")
    batch: int = 1
    points: list[tuple[float, float]] = Field(
        default_factory=list, description="(bytes, median us) that were fitted"
    )
    engine_kernel: bool = Field(
        True,
        description="the benchmark ran the kernel engines run for this family (cuBLAS linear, "
        "FlashAttention SDPA); False for stand-ins (PyTorch grouped GEMM for fused MoE), which "
        "predict uses for the generic engine only",
    )
    note: str = ""


class TraceOp(BaseModel):
    """Per-step time of one op class measured in an engine's own trace (``ceiling trace
    --out``): predict uses it in place of profile fits, tables and priors for the ops it
    names (source ``trace``). A ``group`` class (e.g. every GEMM, when kernel names do not tell
    the layer role) scales its ops' expected times together to the measured sum."""

    op_class: str
    ops: list[str] = Field(description="predict's op names (ceiling/predict/ops.py) it measures")
    group: bool = False
    ms_per_step: float
    calls_per_step: float = 0.0
    engine: str | None = Field(None, description="the engine whose kernels these are")
    batch: int | None = Field(None, description="sequences per step in the trace, if known")
    context: int | None = Field(None, description="tokens of context per sequence, if known")
    kernels: list[str] = Field(default_factory=list, description="the largest kernels")
    trace: str = Field("", description="the trace file(s)")


class HardwareProfile(BaseModel):
    """Measured numbers for one machine; each None means 'use the datasheet'."""

    schema_version: int = SCHEMA_VERSION
    machine: str | None = Field(None, description="free text: host, GPU model, date")
    created: str | None = None
    gpu: str | None = Field(None, description="catalog name of the GPU measured, if known")
    gpu_name_raw: str | None = Field(None, description="what the driver calls the GPU")
    device: str | None = Field(
        None, description="'cuda' or 'cpu': what calibrate measured (a cpu profile is no GPU's)"
    )
    copy_bw_GBps: float | None = Field(None, description="device-to-device copy, read+write")
    mem_bw_GBps: float | None = Field(None, description="achieved HBM/GDDR read bandwidth")
    gemv_bw_GBps: dict[str, float] = Field(
        default_factory=dict,
        description="achieved weight-read bandwidth at decode shapes, per dtype",
    )
    kernel_launch_us_eager: float | None = None
    kernel_launch_us_graph: float | None = None
    gemm_fixed_us_graph: float | None = Field(
        None,
        description="fixed cost of one small memory-bound GEMM kernel in a CUDA graph: the "
        "intercept t0 of t = t0 + bytes / bw over GEMV sizes (predict's per-GEMM cost)",
    )
    collectives: list[CollectiveFit] = Field(default_factory=list)
    ops: list[OpFit] = Field(
        default_factory=list, description="per kernel family (calibrate --ops)"
    )
    trace_ops: list[TraceOp] = Field(
        default_factory=list, description="per op class, from an engine's trace (ceiling trace)"
    )
    notes: list[str] = Field(default_factory=list)
    engine: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="per engine: its own kernels' measurements (calibrate --engine NAME), in "
        "the form that engine's predictor reads and checks",
    )

    def merge(self, other: HardwareProfile) -> HardwareProfile:
        """Combine two profiles (e.g. calibrate + commbench); ``other`` wins where both measured."""
        data = self.model_dump()
        for key, value in other.model_dump().items():
            if key in ("collectives", "ops", "trace_ops"):
                data[key] = data[key] + value
            elif key in ("gemv_bw_GBps", "engine"):
                data[key] = {**data[key], **value}
            elif key == "notes":
                data[key] = data[key] + [n for n in value if n not in data[key]]
            elif value is not None:
                data[key] = value
        return HardwareProfile.model_validate(data)


def _as_current(data: dict[str, Any], p: Path) -> dict[str, Any]:
    """A profile of any version written so far, in the current form (module docstring)."""
    version, kind = data.get("schema_version", 1), data.get("kind")
    if version == SCHEMA_VERSION:
        return data
    if version != 1:
        raise CeilingError(
            f"profile {p} has schema_version {version}, expected {SCHEMA_VERSION}",
            fix="re-run `ceiling calibrate` with this version of ceiling",
        )
    if kind is None:  # a version-1 hardware profile: the same fields
        return {**data, "schema_version": SCHEMA_VERSION}
    if isinstance(kind, str) and kind.endswith("-kernels"):  # one engine's kernel file
        section = {k: v for k, v in data.items() if k not in ("schema_version", "kind")}
        return {
            "schema_version": SCHEMA_VERSION,
            "gpu": data.get("gpu"),
            "engine": {kind.removesuffix("-kernels"): section},
        }
    raise CeilingError(
        f"{p} is a {kind!r} file, not a hardware or kernel profile",
        fix="pass a file written by `ceiling calibrate` or `ceiling commbench` (--out)",
    )


def load_profile(path: str | Path) -> HardwareProfile:
    """Read a profile file (any version, either kind of version 1), with errors that name the
    file and the field."""
    p = Path(path)
    fix = "pass a file written by `ceiling calibrate` or `ceiling commbench` (--out)"
    data = read_json(p, "profile", fix=fix)
    if not isinstance(data, dict):
        raise CeilingError(f"profile {p} is not a JSON object", fix=fix)
    try:
        return HardwareProfile.model_validate(_as_current(data, p))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(x) for x in first["loc"])
        raise CeilingError(
            f"profile {p}: field '{field}': {first['msg']}", fix="fix or regenerate the file"
        ) from exc


def save_profile(profile: HardwareProfile, path: str | Path) -> Path:
    p = Path(path)
    write_atomic(p, profile.model_dump_json(indent=2) + "\n", what="profile")
    return p
