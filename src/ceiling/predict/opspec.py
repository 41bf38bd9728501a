"""The nouns of the per-op step model: an op (``OpSpec``, with its typed shape), one call's
latency (``OpTime``) and an op's row in a step (``OpRow``).

``ops`` builds the ops, ``evidence`` and ``comm`` time them, ``step`` sums the rows and
``overlap`` moves time between them; this module is what they share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class GemmShape:
    """A GEMM: ``m`` tokens x ``k`` inputs -> ``n`` outputs."""

    m: float
    n: int
    k: int


@dataclass
class AttentionShape:
    """Decode attention over a KV cache (GQA/MHA, and MLA's DSA indexer scores)."""

    batch: float
    context: float
    heads: int
    kv_heads: int
    head_dim: int
    kv_dtype: str


@dataclass
class MlaShape:
    """MLA decode attention over the latent cache."""

    batch: float
    context: float
    heads: int


@dataclass
class GdnShape:
    """Gated DeltaNet's recurrent state update."""

    batch: float
    state_bytes: float


@dataclass
class MoeShape:
    """The fused routed-experts op on this rank."""

    tokens: float
    hidden: int
    inter: int
    experts: int
    topk: int
    moe_tp: int
    ep: int
    busiest_experts: float
    expert_bytes: float


@dataclass
class CommShape:
    """One collective: ``bytes`` per call over ``ranks`` ranks (``allgather``: what each
    rank contributes; ``reducescatter``: the full input each rank holds)."""

    collective: Literal["allreduce", "gather", "alltoall", "send", "allgather", "reducescatter"]
    bytes: float
    ranks: int


OpShape = GemmShape | AttentionShape | MlaShape | GdnShape | MoeShape | CommShape | None


@dataclass
class OpSpec:
    """One operation of a decode step (``count`` identical calls per step, per GPU)."""

    name: str
    kind: str  # gemm | moe | attention | mla | gdn | elementwise | comm | sampling | host
    count: float
    weight_bytes: float = 0.0  # per call, this GPU
    kv_bytes: float = 0.0  # KV cache / recurrent state bytes per call
    act_bytes: float = 0.0
    flops: float = 0.0  # per call
    fmt: str = "bf16"  # weight storage format (WeightFormat.name)
    compute: str = "bf16"  # tensor-core dtype
    kernels: int = 1  # kernel launches per call (eager issue cost)
    shape: OpShape = None


@dataclass
class OpTime:
    """One call of one op: expected and bound latency (us) and where the number came from."""

    expected_us: float
    bound_us: float
    source: str  # trace | profile | table | prior | engine | physics
    confidence: float
    family: str = ""
    note: str = ""


@dataclass
class OpRow:
    """One op of a step with its timing (per step: count x per-call)."""

    name: str
    kind: str
    count: float
    expected_ms: float
    bound_ms: float
    source: str
    confidence: float
    family: str
    note: str
    weight_bytes: float
    kv_bytes: float
    hidden_ms: float = 0.0  # expected time hidden behind another stream (predict.overlap)
