"""GQA attention + routed experts (Qwen2/3-MoE, GLM-4.x MoE, MiniMax-M2, gpt-oss).

They differ only in how their expert modules are named: MiniMax-M2 keeps Mixtral's
``block_sparse_moe.experts.N.w1/w3/w2``; gpt-oss stores every expert's gate and up projections
in one fused tensor (``mlp.experts.gate_up_proj``) behind ``mlp.router``; Qwen2-MoE has one
gated shared expert (``mlp.shared_expert`` + ``mlp.shared_expert_gate``).
"""

from __future__ import annotations

from ceiling.spec.families.base import Family, MoeNames


class GqaMoeFamily(Family):
    name = "gqa_moe"
    architectures = (
        "Qwen3MoeForCausalLM",
        "Qwen2MoeForCausalLM",
        "Glm4MoeForCausalLM",
        "MiniMaxM2ForCausalLM",
        "GptOssForCausalLM",
    )
    moe_names_of = {  # noqa: RUF012 (class data, read only)
        "MiniMaxM2ForCausalLM": MoeNames(prefix="block_sparse_moe", experts=("w1", "w3", "w2")),
        "GptOssForCausalLM": MoeNames(router="mlp.router", fused_gate_up=True),
        "Qwen2MoeForCausalLM": MoeNames(shared="mlp.shared_expert"),
    }
