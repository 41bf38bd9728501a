"""DeepSeek-style MLA + MoE models (DeepSeek-V2/V3, Kimi-K2 through its wrapper, GLM-5).

Multi-head latent attention caches one compressed latent (``kv_lora_rank``) plus the shared
rope key per token and layer, replicated on every TP rank; queries may be compressed too
(``q_lora_rank``). GLM-5's sparse attention adds a small replicated indexer with its own key
cache (``index_n_heads``, ``index_head_dim``).
"""

from __future__ import annotations

from typing import Any

from ceiling.spec.families.base import ArchConfig, Builder, Family, get, require
from ceiling.spec.modelspec import LayerSpec


class MlaMoeFamily(Family):
    name = "mla_moe"
    architectures = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "GlmMoeDsaForCausalLM")


def read_mla(cfg: dict[str, Any], where: str) -> dict[str, int]:
    """The MLA ranks of a config with ``kv_lora_rank`` (empty: the model has no MLA)."""
    if cfg.get("kv_lora_rank") is None:
        return {}
    nope = int(require(cfg, "qk_nope_head_dim", where))
    rope = int(require(cfg, "qk_rope_head_dim", where))
    return {
        "q_lora_rank": int(cfg.get("q_lora_rank") or 0),
        "kv_lora_rank": int(cfg["kv_lora_rank"]),
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": int(get(cfg, "v_head_dim", default=nope)),
        # DSA (GLM-5, DeepSeek-V3.2): the main attention reads only the indexer's top-k tokens
        **({"index_topk": int(cfg["index_topk"])} if cfg.get("index_topk") else {}),
    }


def mla_attention(b: Builder, c: ArchConfig, i: int, kind: str) -> None:
    a = f"model.layers.{i}.self_attn"
    mla, h, heads = c.mla, c.hidden, c.heads
    q_lora, kv_lora = mla["q_lora_rank"], mla["kv_lora_rank"]
    nope, rope, v_dim = mla["qk_nope_head_dim"], mla["qk_rope_head_dim"], mla["v_head_dim"]
    if q_lora:
        b.add(f"{a}.q_a_proj", "attn_replicated", q_lora, h, i, "replicate")
        b.add(f"{a}.q_b_proj", "attn", heads * (nope + rope), q_lora, i, "tp")
    else:
        b.add(f"{a}.q_proj", "attn", heads * (nope + rope), h, i, "tp")
    b.add(f"{a}.kv_a_proj_with_mqa", "attn_replicated", kv_lora + rope, h, i, "replicate")
    b.add(f"{a}.kv_b_proj", "attn", heads * (nope + v_dim), kv_lora, i, "tp")
    b.add(f"{a}.o_proj", "attn", h, heads * v_dim, i, "tp")
    kv_per_tok = kv_lora + rope
    index_heads = int(c.cfg.get("index_n_heads") or 0)
    index_dim = int(c.cfg.get("index_head_dim") or 0)
    if index_heads:  # DeepSeek-style sparse attention indexer (GLM-5): small, replicated
        b.add(
            f"{a}.indexer.wq_b",
            "attn_replicated",
            index_heads * index_dim,
            q_lora or h,
            i,
            "replicate",
        )
        b.add(f"{a}.indexer.wk", "attn_replicated", index_dim, h, i, "replicate")
        b.add(f"{a}.indexer.weights_proj", "attn_replicated", index_heads, h, i, "replicate")
        kv_per_tok += index_dim  # indexer key cache (fp8 in vLLM; counted at KV dtype)
    b.layers.append(LayerSpec(i, "mla", c.mlp_kind(i), kv_per_tok, 1))
