"""Hybrid linear-attention MoE models (Qwen3-Next, Qwen3.5-MoE).

Most layers are Gated DeltaNet linear attention (a recurrent state per sequence, no KV cache:
``linear_num_key_heads`` x ``linear_key_head_dim`` keys, value heads alike, a short causal
convolution of ``linear_conv_kernel_dim``); every ``full_attention_interval``-th layer is full
GQA attention with an output gate. The MoE block has one gated shared expert.
"""

from __future__ import annotations

from ceiling.spec.families.base import ArchConfig, Builder, Family, MoeNames
from ceiling.spec.modelspec import LayerSpec


class HybridMoeFamily(Family):
    name = "hybrid_moe"
    architectures = (
        "Qwen3NextForCausalLM",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5MoeForConditionalGeneration",
    )
    moe_names = MoeNames(shared="mlp.shared_expert")

    def attention_kind(self, c: ArchConfig, i: int) -> str:
        interval = c.cfg.get("full_attention_interval")
        if c.mla or c.cfg.get("layer_types") or not interval:
            return super().attention_kind(c, i)
        return "full" if (i + 1) % int(interval) == 0 else "linear"


def linear_attention(b: Builder, c: ArchConfig, i: int, kind: str) -> None:
    cfg = c.cfg
    k_heads = int(cfg.get("linear_num_key_heads") or 0)
    v_heads = int(cfg.get("linear_num_value_heads") or 0)
    k_dim = int(cfg.get("linear_key_head_dim") or 0)
    v_dim = int(cfg.get("linear_value_head_dim") or 0)
    conv_k = int(cfg.get("linear_conv_kernel_dim") or 4)
    a, h = f"model.layers.{i}.linear_attn", c.hidden
    key_dim, val_dim = k_heads * k_dim, v_heads * v_dim
    if c.arch.startswith("Qwen3_5"):
        # Qwen3.5/3.6 checkpoints store the input projection split, and quantize the parts
        # apart (nvidia's NVFP4 checkpoint: qkv and z in FP8, b and a in BF16). The tiny b/a
        # (gate) projections are kind linear_attn_gate: the engines run them as a GEMM of their
        # own, and exports keep them 16-bit (quant.KEEP_16BIT_KINDS)
        b.add(f"{a}.in_proj_qkv", "linear_attn", 2 * key_dim + val_dim, h, i, "tp")
        b.add(f"{a}.in_proj_z", "linear_attn", val_dim, h, i, "tp")
        b.add(f"{a}.in_proj_b", "linear_attn_gate", v_heads, h, i, "tp")
        b.add(f"{a}.in_proj_a", "linear_attn_gate", v_heads, h, i, "tp")
    else:  # Qwen3-Next: fused qkvz and ba
        b.add(f"{a}.in_proj_qkvz", "linear_attn", 2 * key_dim + 2 * val_dim, h, i, "tp")
        b.add(f"{a}.in_proj_ba", "linear_attn_gate", 2 * v_heads, h, i, "tp")
    b.add(f"{a}.conv1d", "linear_attn", 2 * key_dim + val_dim, conv_k, i, "tp", linear=False)
    b.add(f"{a}.out_proj", "linear_attn", h, val_dim, i, "tp")
    ssm_bytes = 4 if str(cfg.get("mamba_ssm_dtype", "float32")) == "float32" else 2
    # the recurrent state (float32 by default) and the convolution's last inputs (16-bit)
    state = v_heads * k_dim * v_dim * ssm_bytes + (2 * key_dim + val_dim) * (conv_k - 1) * 2
    b.layers.append(LayerSpec(i, "linear", c.mlp_kind(i), 0, 0, state_bytes=state))
