"""Deployment: how the model is served (engine, parallel layout, dtypes, graphs, allreduce).

The engine-specific rules that change the prediction (when the custom one-shot allreduce is
used, host overhead per step, memory utilization) come from ``data/predict/engines.yaml``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, RootModel

from ceiling.errors import CeilingError
from ceiling.spec._data import DataModel, load_yaml
from ceiling.spec.hardware import Link

KV_DTYPE_BYTES = {
    "auto": None,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
}


class CustomAllreduceRule(DataModel):
    """When the engine uses its custom (one-shot) allreduce instead of NCCL."""

    world_sizes: list[int]
    pcie_max_world: int
    requires_p2p: bool
    max_bytes: int = Field(8 * 2**20, description="the custom-allreduce buffer (vLLM: 8 MiB)")
    rule: str


class SharedExpertStreamRule(DataModel):
    """When the engine runs a MoE layer's shared expert on a second CUDA stream."""

    max_tokens: int
    skip_arch: list[str] = Field(default_factory=list)
    architectures: list[str] = Field(
        default_factory=list, description="model architecture prefixes (empty: every MoE model)"
    )
    rule: str


class DcpRule(DataModel):
    """How the engine runs decode context parallel (``--dcp``): which attention it shards and
    the collectives each sharded attention layer adds (``data/predict/engines.yaml``)."""

    attention: list[Literal["mla", "gqa"]]
    comm_backend: Literal["ag_rs", "a2a"]
    what_if_min_context: int = Field(description="contexts from which what-if offers DCP")
    source: str


class QkNormRule(DataModel):
    """Per-head q/k RMSNorm the engine's model file runs in every attention layer, for the
    architectures listed (predict's fused op list has no such op otherwise)."""

    architectures: list[str] = Field(description="model architecture names it applies to")
    kernels: int = Field(description="kernels on the step's critical path per attention layer")
    rule: str


class DsaRule(DataModel):
    """What the engine runs for DeepSeek sparse attention (GLM-5, DeepSeek-V3.2) beyond
    predict's indexer GEMM and scoring op and its MLA decode op."""

    kv_fp8_from_sm: int = Field(
        description="--kv-dtype auto becomes an fp8 KV cache from this compute capability x10"
    )
    indexer_gemms: int = Field(description="indexer GEMMs one after another on the main stream")
    indexer_small_kernels: int = Field(
        description="indexer elementwise kernels on the main stream beyond the scoring op's"
    )
    attention_small_kernels: int = Field(
        description="elementwise kernels of the sparse MLA decode beyond predict's MLA op"
    )
    source: str


class EngineEntry(DataModel):
    """One engine of ``data/predict/engines.yaml``."""

    custom_allreduce: CustomAllreduceRule
    host_ms: float
    host_sync_ms: float
    host_source: str
    overlap_off: dict[str, str] = Field(
        default_factory=dict, description="model kind -> why the engine runs synchronously"
    )
    kernels: Literal["fused", "pytorch"]
    shared_expert_stream: SharedExpertStreamRule | None = None
    decode_context_parallel: DcpRule | None = None
    qk_norm: QkNormRule | None = None
    dsa: DsaRule | None = None
    gpu_memory_utilization: float
    activation_reserve_GiB: float


class EnginesFile(RootModel[dict[str, EngineEntry]]):
    """``data/predict/engines.yaml``: engine name -> its rules."""


def engines_table() -> dict[str, EngineEntry]:
    """Every engine's rules (``data/predict/engines.yaml``, validated)."""
    return load_yaml("predict/engines.yaml", schema=EnginesFile).root


class EngineRules(BaseModel):
    name: str
    world_sizes: list[int]
    pcie_max_world: int
    requires_p2p: bool
    rule: str
    custom_ar_max_bytes: int
    host_ms: float
    kernels: str
    gpu_memory_utilization: float
    activation_reserve_GiB: float


def engine_rules(engine: str) -> EngineRules:
    table = engines_table()
    if engine not in table:
        raise CeilingError(f"unknown engine '{engine}'", fix="one of: " + ", ".join(table))
    e = table[engine]
    ar = e.custom_allreduce
    return EngineRules(
        name=engine,
        world_sizes=ar.world_sizes,
        pcie_max_world=ar.pcie_max_world,
        requires_p2p=ar.requires_p2p,
        rule=ar.rule,
        custom_ar_max_bytes=ar.max_bytes,
        host_ms=e.host_ms,
        kernels=e.kernels,
        gpu_memory_utilization=e.gpu_memory_utilization,
        activation_reserve_GiB=e.activation_reserve_GiB,
    )


class Deployment(BaseModel):
    """The serving layout. ``ep`` > 1 shards routed experts over EP ranks instead of TP."""

    engine: Literal["vllm", "sglang", "trtllm", "generic", "llamacpp"] = "vllm"
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    dcp: int = Field(1, ge=1, description="decode context parallel: KV shards within TP")
    kv_dtype: str = "auto"
    cuda_graphs: bool = True
    allreduce: Literal["auto", "nccl", "oneshot"] = "auto"

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    def resolve_allreduce(self, link: Link) -> tuple[str, str]:
        """(implementation, reason) for the per-layer TP allreduce on this link."""
        rules = engine_rules(self.engine)
        if self.tp == 1:
            return "none", "TP=1: no tensor-parallel allreduce"
        if self.allreduce == "nccl":
            return "nccl", "--allreduce nccl"
        if self.allreduce == "oneshot":
            if link.oneshot is None:
                raise CeilingError(
                    f"one-shot allreduce needs P2P, and link '{link.name}' has none",
                    fix="use --allreduce nccl or a link with P2P",
                )
            return "oneshot", "--allreduce oneshot (forced)"
        # auto: the engine's rule
        if link.oneshot is None or (rules.requires_p2p and not link.p2p):
            return "nccl", f"{self.engine}: custom allreduce off without P2P"
        if self.tp not in rules.world_sizes:
            return "nccl", f"{self.engine}: custom allreduce does not support world size {self.tp}"
        if link.custom_ar_class == "pcie" and self.tp > rules.pcie_max_world:
            return "nccl", f"{self.engine}: {rules.rule}"
        return (
            "oneshot",
            f"{self.engine}: custom one-shot allreduce enabled ({link.custom_ar_class})",
        )

    def kv_elem_bytes(self, checkpoint_kv: str | None) -> tuple[float, str]:
        """Bytes per KV element and what decided it (``auto`` = model dtype, as vLLM does)."""
        if self.kv_dtype not in KV_DTYPE_BYTES:
            raise CeilingError(
                f"unknown KV dtype '{self.kv_dtype}'", fix="one of: " + ", ".join(KV_DTYPE_BYTES)
            )
        b = KV_DTYPE_BYTES[self.kv_dtype]
        if b is None:
            return 2.0, "kv cache bf16 (--kv-dtype auto = model dtype)" + (
                "; the checkpoint ships FP8 KV scales: --kv-dtype fp8 would halve KV reads"
                if checkpoint_kv == "fp8"
                else ""
            )
        return b, f"kv cache {self.kv_dtype} ({b:g} byte/element)"
