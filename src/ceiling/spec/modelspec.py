"""The nouns of a model as ``predict`` sees it: ModelSpec, its weight Modules and LayerSpecs.

A model is a list of weight modules (one per kind per layer, experts counted once with a
multiplicity), each with its shape, its storage format (from the quantization config) and how
tensor parallelism shards it, plus the per-token KV-cache geometry of every layer. Nothing here
knows about hardware, nor how a config.json becomes a ModelSpec (``spec/families/``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ceiling.spec.quant import QuantScheme, WeightFormat, override_scheme


@dataclass
class Module:
    """One weight matrix kind in one layer (``count`` identical copies, e.g. routed experts).

    kind: attn | attn_replicated | mlp | expert | shared | shared_gate | router | linear_attn |
          linear_attn_gate | lm_head | embed | norm
    ``shard``: "tp" (split across tensor-parallel ranks), "replicate" (full copy on every rank),
    "ep" (experts: split across EP ranks, or across TP ranks when EP=1).
    """

    name: str
    kind: str
    rows: int
    cols: int
    count: int
    layer: int | None
    shard: str
    linear: bool
    fmt: WeightFormat = field(default=None)  # type: ignore[assignment]
    nbytes: int = 0  # all copies, scales included

    @property
    def params(self) -> int:
        return self.rows * self.cols * self.count


@dataclass
class LayerSpec:
    """Per-layer facts used for KV cache, kernels and collectives."""

    index: int
    attention: str  # full | sliding | linear | mla
    mlp: str  # dense | moe
    kv_bytes_per_token: int  # at 1 byte/element; multiply by the KV dtype's bytes
    kv_heads: int  # KV heads of this layer (MLA: 1 latent head, replicated under TP)
    window: int | None = None  # sliding window tokens
    state_bytes: int = 0  # recurrent state per sequence (linear attention), bytes


@dataclass
class ModelSpec:
    """The model as ``predict`` sees it."""

    name: str
    source: str
    architecture: str
    family: str
    hidden: int
    num_layers: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    attention: str  # gqa | mla | hybrid
    dtype: str
    quant: QuantScheme
    modules: list[Module]
    layers: list[LayerSpec]
    n_experts: int = 0
    top_k: int = 0
    n_shared: int = 0
    moe_intermediate: int = 0
    mla: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # lm_head shares the embedding (tie_word_embeddings): a GGUF then has no output.weight
    tied_embeddings: bool = False

    # ---------------------------------------------------------------- derived totals
    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def moe_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.mlp == "moe")

    def total_params(self) -> int:
        return sum(m.params for m in self.modules)

    def active_params(self) -> int:
        """Parameters touched per token (top-k routed experts, not all of them; no embedding)."""
        cached: int | None = self.__dict__.get("_active")
        if cached is None:
            cached = self.__dict__["_active"] = self._active_params()
        return cached

    def _active_params(self) -> int:
        total = 0
        for m in self.modules:
            if m.kind == "embed":
                continue
            if m.kind == "expert":
                total += m.rows * m.cols * self.top_k
            else:
                total += m.params
        return total

    def weight_bytes(self) -> int:
        return sum(m.nbytes for m in self.modules)

    def bytes_by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for m in self.modules:
            out[m.kind] = out.get(m.kind, 0) + m.nbytes
        return out

    def kv_bytes_per_token(self, kv_elem_bytes: float) -> float:
        """KV bytes one token adds across all layers (full-attention layers; unsharded)."""
        return sum(layer.kv_bytes_per_token for layer in self.layers) * kv_elem_bytes

    def formats(self) -> dict[str, int]:
        """Weight bytes per storage format (for the assumptions list)."""
        out: dict[str, int] = {}
        for m in self.modules:
            out[m.fmt.name] = out.get(m.fmt.name, 0) + m.nbytes
        return out

    def with_weight_format(self, fmt: WeightFormat | None) -> ModelSpec:
        """The same model with every linear layer (except lm_head/routers) stored in ``fmt``."""
        if fmt is None:
            return self
        scheme = override_scheme(fmt, self.dtype)
        modules = [
            Module(m.name, m.kind, m.rows, m.cols, m.count, m.layer, m.shard, m.linear)
            for m in self.modules
        ]
        assign_formats(modules, scheme)
        return dataclasses.replace(self, quant=scheme, modules=modules)


def assign_formats(modules: list[Module], quant: QuantScheme) -> None:
    """Each module's storage format under ``quant``, and its bytes (all copies, with scales)."""
    for m in modules:
        m.fmt = quant.format_for(m.name, m.kind, m.linear)
        m.nbytes = m.fmt.nbytes(m.rows, m.cols) * m.count
