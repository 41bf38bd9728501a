"""Dense decoder-only models: GQA attention (full or sliding) and a gated MLP in every layer."""

from __future__ import annotations

from ceiling.spec.families.base import Family


class DenseFamily(Family):
    name = "dense"
    architectures = (
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
    )
