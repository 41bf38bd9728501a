"""ModelSpec parsing: every family of shipped config, by structure and by parameter count."""

from __future__ import annotations

import json
import shutil

import pytest

from ceiling.errors import CeilingError
from ceiling.spec.model import build_model, catalog, load_model


def test_every_catalog_model_parses():
    names = list(catalog())
    assert len(names) >= 25
    for name in names:
        spec = load_model(name)
        assert spec.num_layers == len(spec.layers)
        assert spec.weight_bytes() > 0
        assert spec.kv_bytes_per_token(2) > 0


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        # published totals (without MTP layers): Llama 8.03B, 70.6B, 405.9B; DeepSeek-V3 671B;
        # Kimi-K2 1.04T ("1T"), Qwen3-235B, Qwen3-30B, gpt-oss-120b 116.8B, MiniMax-M2 229B,
        # GLM-4.7 355B, Qwen3.5-397B, GLM-5 744B.
        ("llama-3.1-8b", 8.03),
        ("llama-3.1-70b", 70.55),
        ("llama-3.1-405b", 405.85),
        ("deepseek-v3", 671.0),
        ("kimi-k2.5", 1026.4),
        ("qwen3-235b-a22b", 235.1),
        ("qwen3-30b-a3b", 30.5),
        ("gpt-oss-120b", 116.8),
        ("minimax-m2.5", 228.7),
        ("glm-4.7-fp8", 352.8),
        ("qwen3.5-397b-a17b", 396.3),
        ("glm-5-fp8", 743.9),
    ],
)
def test_total_params_match_published(name, billions):
    assert load_model(name).total_params() / 1e9 == pytest.approx(billions, rel=0.01)


def test_llama_8b_exact_params():
    # embed 128256*4096 + lm_head 128256*4096 + 32 layers * (q 4096^2 + k,v 2*1024*4096
    # + o 4096^2 + mlp 3*14336*4096 + 2 norms*4096) + final norm 4096 = 8,030,261,248
    assert load_model("llama-3.1-8b").total_params() == 8_030_261_248


def test_kimi_k25_nested_text_config_and_mla_moe():
    spec = load_model("kimi-k2.5")
    assert spec.architecture == "KimiK25ForConditionalGeneration"
    assert spec.attention == "mla"
    assert spec.mla == {
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    }
    assert (spec.n_experts, spec.top_k, spec.n_shared) == (384, 8, 1)
    # first_k_dense_replace = 1: layer 0 dense, 60 MoE layers
    assert spec.layers[0].mlp == "dense"
    assert spec.moe_layers == 60
    # MLA caches kv_lora_rank + rope dim per token per layer: (512 + 64) * 61 elements
    assert spec.kv_bytes_per_token(1) == 576 * 61


def test_deepseek_v3_dense_first_three():
    spec = load_model("deepseek-v3")
    assert [layer.mlp for layer in spec.layers[:4]] == ["dense", "dense", "dense", "moe"]
    assert (spec.n_experts, spec.top_k) == (256, 8)


def test_qwen3_moe_gqa():
    spec = load_model("qwen3-235b-a22b")
    assert spec.attention == "gqa" and (spec.heads, spec.kv_heads, spec.head_dim) == (64, 4, 128)
    assert spec.moe_layers == 94 and spec.n_shared == 0
    # 2 (k and v) * 4 heads * 128 * 94 layers elements per token
    assert spec.kv_bytes_per_token(1) == 2 * 4 * 128 * 94


def test_minimax_gqa_moe_names_and_expert_width():
    spec = load_model("minimax-m2.5")
    experts = [m for m in spec.modules if m.kind == "expert" and m.layer == 0]
    assert {m.name.rsplit(".", 1)[1] for m in experts} == {"w1", "w2", "w3"}
    assert spec.moe_intermediate == 1536 and spec.n_experts == 256


def test_glm47_shared_expert_and_dense_layers():
    spec = load_model("glm-4.7-fp8")
    assert spec.n_shared == 1 and spec.moe_layers == 92 - 3
    assert any("ceiling added quantization_config" in n for n in spec.notes)


def test_gpt_oss_alternating_sliding_window():
    spec = load_model("gpt-oss-120b")
    kinds = [layer.attention for layer in spec.layers[:4]]
    assert kinds == ["sliding", "full", "sliding", "full"]
    assert spec.layers[0].window == 128 and spec.layers[1].window is None
    assert (spec.n_experts, spec.top_k) == (128, 4)


def test_qwen35_hybrid_linear_attention():
    spec = load_model("qwen3.5-397b-a17b")
    assert spec.attention == "hybrid"
    full = [layer.index for layer in spec.layers if layer.attention == "full"]
    assert full == list(range(3, 60, 4))  # full_attention_interval 4
    linear = [layer for layer in spec.layers if layer.attention == "linear"]
    assert all(layer.kv_bytes_per_token == 0 and layer.state_bytes > 0 for layer in linear)
    # KV only on the 15 full-attention layers: 2 * 2 kv heads * 256 head_dim
    assert spec.kv_bytes_per_token(1) == 15 * 2 * 2 * 256
    # output gate doubles q_proj: 32 heads * 256 * 2 rows
    q = next(m for m in spec.modules if m.name == "model.layers.3.self_attn.q_proj")
    assert q.rows == 32 * 256 * 2


def test_model_directory_with_hf_quant_config(tmp_path):
    src = catalog()["glm-5-nvfp4"].parent
    shutil.copytree(src, tmp_path / "glm5")
    spec = load_model(str(tmp_path / "glm5"))
    assert spec.quant.method == "modelopt"
    assert spec.name == "glm5"


def test_config_file_path(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(catalog()["qwen2.5-7b"].read_text())
    assert load_model(str(p)).num_layers == 28


def test_unknown_architecture_names_the_field(tmp_path):
    raw = json.loads(catalog()["llama-3.1-8b"].read_text())
    raw["architectures"] = ["MysteryForCausalLM"]
    with pytest.raises(CeilingError, match="architectures"):
        build_model(raw)


def test_unknown_model_name():
    with pytest.raises(CeilingError, match="unknown model"):
        load_model("no-such-model-xyz")


def test_missing_field_is_named():
    raw = json.loads(catalog()["llama-3.1-8b"].read_text())
    del raw["hidden_size"]
    with pytest.raises(CeilingError, match="hidden_size"):
        build_model(raw)


def test_qwen35_gated_deltanet_projections_split_as_stored():
    """Qwen3.5/3.6 store the GDN input projection as in_proj_qkv / in_proj_z / in_proj_b /
    in_proj_a (quantized apart); Qwen3-Next fuses them (in_proj_qkvz, in_proj_ba). Same bytes."""
    spec = load_model("src/ceiling/data/predict/reference/models/qwen3.5-35b-a3b")
    names = {m.name.rsplit(".", 1)[1]: m for m in spec.modules if m.layer == 0}
    assert {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"} <= set(names)
    assert "in_proj_qkvz" not in names
    # 16 key heads x 128 (q and k) + 32 value heads x 128 (v); z: 32 x 128; b, a: one per head
    assert names["in_proj_qkv"].rows == 2 * 16 * 128 + 32 * 128
    assert names["in_proj_z"].rows == 32 * 128 and names["in_proj_b"].rows == 32
