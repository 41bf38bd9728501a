"""What every model family shares: the config fields all of them read (``ArchConfig``), the
module list being built (``Builder``), the plug-in interface (``Family``) and the blocks most
families are made of (GQA attention, a dense MLP, a routed-expert MoE block).

A family module (llama.py, deepseek.py, moe.py, qwen_next.py) names its architectures and
overrides what differs: its attention block, which layers it uses it on, and the names of its
expert modules. ``families/__init__.py`` plugs them into one builder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ceiling.errors import CeilingError
from ceiling.spec.modelspec import LayerSpec, Module

FULL_CONFIG = "pass the model's complete Hugging Face config.json"


def get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    """The first of ``keys`` that ``cfg`` sets (not null), else ``default``."""
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def require(cfg: dict[str, Any], key: str, where: str) -> Any:
    if cfg.get(key) is None:
        raise CeilingError(
            f"config field '{key}' is missing ({where})", fix="pass a complete HF config.json"
        )
    return cfg[key]


@dataclass
class ArchConfig:
    """The hyperparameters every family reads, from the (text) config of one model."""

    arch: str  # the config's own architecture (a wrapper's, for a multimodal model)
    cfg: dict[str, Any]  # the language model's config (``text_config`` when nested)
    where: str  # "name: Architecture", for messages
    hidden: int
    n_layers: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    n_experts: int
    top_k: int
    moe_inter: int
    n_shared: int
    shared_inter: int
    first_dense: int
    moe_freq: int
    sparse_step: int
    mlp_only: set[int]
    mla: dict[str, int] = field(default_factory=dict)  # MLA ranks (deepseek.py), else empty

    @classmethod
    def read(cls, arch: str, cfg: dict[str, Any], where: str) -> ArchConfig:
        hidden = int(require(cfg, "hidden_size", where))
        n_layers = int(require(cfg, "num_hidden_layers", where))
        vocab = int(require(cfg, "vocab_size", where))
        heads = int(require(cfg, "num_attention_heads", where))
        inter = int(get(cfg, "intermediate_size", default=0))
        n_experts = int(
            get(cfg, "n_routed_experts", "num_experts", "num_local_experts", default=0) or 0
        )
        top_k = int(
            get(cfg, "num_experts_per_tok", "experts_per_token", "moe_topk", default=0) or 0
        )
        if n_experts and not top_k:
            raise CeilingError(
                f"MoE config without top-k (field num_experts_per_tok) in {where}", fix=FULL_CONFIG
            )
        moe_inter = int(get(cfg, "moe_intermediate_size", default=0) or 0)
        if n_experts and not moe_inter:
            moe_inter = inter  # MiniMax-M2 and gpt-oss name the expert width intermediate_size
        n_shared = int(get(cfg, "n_shared_experts", default=0) or 0)
        shared_inter = n_shared * moe_inter
        for key in ("shared_expert_intermediate_size", "shared_intermediate_size"):
            if cfg.get(key):  # one shared expert of this width
                shared_inter, n_shared = int(cfg[key]), 1
        return cls(
            arch=arch,
            cfg=cfg,
            where=where,
            hidden=hidden,
            n_layers=n_layers,
            vocab=vocab,
            heads=heads,
            kv_heads=int(get(cfg, "num_key_value_heads", default=heads)),
            head_dim=int(get(cfg, "head_dim", default=hidden // heads)),
            inter=inter,
            n_experts=n_experts,
            top_k=top_k,
            moe_inter=moe_inter,
            n_shared=n_shared,
            shared_inter=shared_inter,
            first_dense=int(get(cfg, "first_k_dense_replace", default=0) or 0),
            moe_freq=int(get(cfg, "moe_layer_freq", default=1) or 1),
            sparse_step=int(get(cfg, "decoder_sparse_step", default=1) or 1),
            mlp_only=set(cfg.get("mlp_only_layers") or []),
        )

    def is_moe(self, i: int) -> bool:
        """Whether layer ``i`` routes to experts (dense first layers, every n-th, exceptions)."""
        if not self.n_experts:
            return False
        if i < self.first_dense or i in self.mlp_only:
            return False
        if self.moe_freq > 1 and (i - self.first_dense) % self.moe_freq != 0:
            return False
        return not (self.sparse_step > 1 and (i + 1) % self.sparse_step != 0)

    def mlp_kind(self, i: int) -> str:
        return "moe" if self.is_moe(i) else "dense"


@dataclass
class Builder:
    """The modules and layers of one model, in the order engines name them."""

    modules: list[Module] = field(default_factory=list)
    layers: list[LayerSpec] = field(default_factory=list)

    def add(
        self,
        name: str,
        kind: str,
        rows: int,
        cols: int,
        layer: int | None,
        shard: str,
        count: int = 1,
        linear: bool = True,
    ) -> None:
        self.modules.append(Module(name, kind, rows, cols, count, layer, shard, linear))


@dataclass(frozen=True)
class MoeNames:
    """How a family names its MoE block's modules (``model.layers.N.<prefix>.experts.0.<w>``)."""

    prefix: str = "mlp"
    experts: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")  # gate, up, down
    shared: str = "mlp.shared_experts"
    router: str | None = None  # default: ``<prefix>.gate``
    fused_gate_up: bool = False  # experts.gate_up_proj + experts.down_proj, all experts in one

    @property
    def shared_gate(self) -> bool:
        """A single shared expert behind a sigmoid gate (Qwen2-MoE and Qwen3-Next style)."""
        return self.shared == "mlp.shared_expert"


class Family:
    """A model family: its architectures, and how one of its layers is built.

    ``name`` is the family label a ModelSpec carries (dense, mla_moe, gqa_moe, hybrid_moe).
    """

    name: ClassVar[str] = ""
    architectures: ClassVar[tuple[str, ...]] = ()
    moe_names: ClassVar[MoeNames] = MoeNames()
    # per-architecture exceptions to ``moe_names`` (the config's own architecture decides)
    moe_names_of: ClassVar[dict[str, MoeNames]] = {}

    def names_for(self, arch: str) -> MoeNames:
        return self.moe_names_of.get(arch, self.moe_names)

    def attention_kind(self, c: ArchConfig, i: int) -> str:
        """full | sliding | linear | mla for layer ``i``."""
        if c.mla:
            return "mla"
        layer_types = c.cfg.get("layer_types")
        if layer_types:
            t = layer_types[i]
            return {"linear_attention": "linear", "sliding_attention": "sliding"}.get(t, "full")
        return "full"


# ---- blocks ------------------------------------------------------------------------------


def gqa_attention(b: Builder, c: ArchConfig, i: int, kind: str) -> None:
    """q/k/v/o projections (q doubled by an output gate) and the K+V cache of one layer."""
    a = f"model.layers.{i}.self_attn"
    q_rows = c.heads * c.head_dim * (2 if c.cfg.get("attn_output_gate") else 1)
    b.add(f"{a}.q_proj", "attn", q_rows, c.hidden, i, "tp")
    b.add(f"{a}.k_proj", "attn", c.kv_heads * c.head_dim, c.hidden, i, "tp")
    b.add(f"{a}.v_proj", "attn", c.kv_heads * c.head_dim, c.hidden, i, "tp")
    b.add(f"{a}.o_proj", "attn", c.hidden, c.heads * c.head_dim, i, "tp")
    window = c.cfg.get("sliding_window") if c.cfg.get("use_sliding_window", True) else None
    win = int(window) if kind == "sliding" and window else None
    kv = 2 * c.kv_heads * c.head_dim
    b.layers.append(LayerSpec(i, kind, c.mlp_kind(i), kv, c.kv_heads, window=win))


def dense_mlp(b: Builder, c: ArchConfig, i: int) -> None:
    if not c.inter:
        raise CeilingError(
            f"dense layer {i} without intermediate_size in {c.where}", fix=FULL_CONFIG
        )
    pre = f"model.layers.{i}.mlp"
    b.add(f"{pre}.gate_proj", "mlp", c.inter, c.hidden, i, "tp")
    b.add(f"{pre}.up_proj", "mlp", c.inter, c.hidden, i, "tp")
    b.add(f"{pre}.down_proj", "mlp", c.hidden, c.inter, i, "tp")


def moe_mlp(b: Builder, c: ArchConfig, i: int, names: MoeNames) -> None:
    """The router, the routed experts (counted once, ``count`` copies) and the shared expert."""
    pre = f"model.layers.{i}"
    m = f"{pre}.{names.prefix}"
    router = names.router or f"{names.prefix}.gate"
    b.add(f"{pre}.{router}", "router", c.n_experts, c.hidden, i, "replicate", linear=False)
    e, h, n = c.moe_inter, c.hidden, c.n_experts
    if names.fused_gate_up:
        b.add(f"{m}.experts.gate_up_proj", "expert", 2 * e, h, i, "ep", count=n)
        b.add(f"{m}.experts.down_proj", "expert", h, e, i, "ep", count=n)
    else:
        g, u, d = names.experts
        b.add(f"{m}.experts.0.{g}", "expert", e, h, i, "ep", count=n)
        b.add(f"{m}.experts.0.{u}", "expert", e, h, i, "ep", count=n)
        b.add(f"{m}.experts.0.{d}", "expert", h, e, i, "ep", count=n)
    if c.shared_inter:
        s, w = f"{pre}.{names.shared}", c.shared_inter
        b.add(f"{s}.gate_proj", "shared", w, h, i, "tp")
        b.add(f"{s}.up_proj", "shared", w, h, i, "tp")
        b.add(f"{s}.down_proj", "shared", h, w, i, "tp")
        if names.shared_gate:  # sigmoid(gate(x)) scales the shared expert: a kind of its own
            b.add(
                f"{pre}.mlp.shared_expert_gate", "shared_gate", 1, h, i, "replicate", linear=False
            )
