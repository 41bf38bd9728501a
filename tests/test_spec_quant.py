"""Quantized weight bytes, hand-checked: a module's bytes include its scales."""

from __future__ import annotations

import pytest

from ceiling.errors import CeilingError
from ceiling.spec.model import load_model
from ceiling.spec.quant import NameMatcher, awq, fp8_block, int_group, mxfp4, nvfp4, parse_quant


def _mod(spec, name):
    return next(m for m in spec.modules if m.name == name)


def test_int4_group32_bytes():
    # 2048 x 7168 int4: 14,680,064 params / 2 = 7,340,032 bytes
    # scales: 2048 rows * (7168/32 = 224) = 458,752 groups * 2 bytes (bf16) = 917,504
    assert int_group(4, 32).nbytes(2048, 7168) == 7_340_032 + 917_504 == 8_257_536


def test_fp8_block_bytes():
    # DeepSeek-V3 q_b_proj 24576 x 1536: 37,748,736 bytes + (192 x 12 blocks) * 4 = 9,216
    assert fp8_block().nbytes(24576, 1536) == 37_748_736 + 9_216
    # non-multiple of 128 rounds the block grid up: 576 x 7168 -> 5 x 56 blocks
    assert fp8_block().nbytes(576, 7168) == 576 * 7168 + 5 * 56 * 4


def test_nvfp4_bytes():
    # 2048 x 7168: 7,340,032 + one fp8 scale per 16 = 917,504 + fp32 global + input scale = 8
    assert nvfp4().nbytes(2048, 7168) == 7_340_032 + 917_504 + 8


def test_mxfp4_bytes():
    # gpt-oss gate_up 5760 x 2880: 8,294,400 + e8m0 scale per 32 = 518,400
    assert mxfp4().nbytes(5760, 2880) == 8_294_400 + 518_400


def test_awq_bytes():
    # 4096 x 4096 int4 g128: 8,388,608 + 131,072 groups * (2 B scale + 0.5 B zero) = 327,680
    assert awq(4, 128).nbytes(4096, 4096) == 8_388_608 + 327_680


def test_kimi_k25_int4_only_routed_experts():
    spec = load_model("kimi-k2.5")
    expert = _mod(spec, "model.layers.1.mlp.experts.0.gate_proj")
    assert expert.fmt.name == "int4-g32"
    # per expert matrix 8,257,536 bytes (above) * 384 experts
    assert expert.nbytes == 8_257_536 * 384
    for name in (
        "model.layers.1.self_attn.q_b_proj",  # re:.*self_attn.*
        "model.layers.1.mlp.shared_experts.down_proj",  # re:.*shared_experts.*
        "model.layers.0.mlp.gate_proj",  # re:.*mlp\.(gate|up|gate_up|down)_proj.*
        "lm_head",
    ):
        assert _mod(spec, name).fmt.name == "bf16", name
    # all routed experts: 60 layers * 3 matrices * 384 * 8,257,536 = 570,760,888,320 bytes
    # (down_proj is 7168 x 2048: 7168 * 64 groups = the same 458,752 scales)
    assert sum(m.nbytes for m in spec.modules if m.kind == "expert") == 570_760_888_320


def test_kimi_k25_nvfp4_glob_ignore_with_wrapper_prefix():
    spec = load_model("kimi-k2.5-nvfp4")
    # ignore 'language_model.model.layers.5.self_attn*' must hit model.layers.5.self_attn.*
    assert _mod(spec, "model.layers.5.self_attn.kv_b_proj").fmt.name == "bf16"
    assert _mod(spec, "model.layers.5.mlp.experts.0.up_proj").fmt.name == "nvfp4"
    # shared experts are NOT in this checkpoint's ignore list
    assert _mod(spec, "model.layers.5.mlp.shared_experts.up_proj").fmt.name == "nvfp4"
    assert spec.quant.kv_cache_dtype == "fp8"


def test_deepseek_fp8_block_all_linears():
    spec = load_model("deepseek-v3")
    m = _mod(spec, "model.layers.0.self_attn.q_b_proj")
    assert m.fmt.name == "fp8-block128x128" and m.nbytes == 37_748_736 + 9_216
    assert _mod(spec, "lm_head").fmt.name == "bf16"


def test_qwen3_fp8_modules_to_not_convert_and_qwen35_nvfp4_ignore():
    q3 = load_model("qwen3-30b-a3b-fp8")
    assert _mod(q3, "model.layers.0.mlp.experts.0.down_proj").fmt.name == "fp8-block128x128"
    q35 = load_model("qwen3.5-397b-a17b-nvfp4")
    assert _mod(q35, "model.layers.0.mlp.experts.0.down_proj").fmt.name == "nvfp4"
    assert _mod(q35, "model.layers.0.mlp.shared_expert.down_proj").fmt.name == "bf16"
    assert _mod(q35, "model.layers.0.linear_attn.in_proj_qkv").fmt.name == "bf16"
    assert _mod(q35, "model.layers.3.self_attn.q_proj").fmt.name == "bf16"


def test_gpt_oss_mxfp4_experts_only():
    spec = load_model("gpt-oss-120b")
    up = _mod(spec, "model.layers.0.mlp.experts.gate_up_proj")
    assert up.fmt.name == "mxfp4" and up.nbytes == (8_294_400 + 518_400) * 128
    assert _mod(spec, "model.layers.0.self_attn.q_proj").fmt.name == "bf16"


def test_modelopt_fp8_directory():
    spec = load_model("llama-3.1-70b-fp8")
    m = _mod(spec, "model.layers.0.mlp.down_proj")
    # per-tensor FP8: 8192 x 28672 bytes + fp32 weight scale + fp32 input scale
    assert m.fmt.name == "fp8-tensor" and m.nbytes == 8192 * 28672 + 8


def test_weight_format_override_keeps_lm_head():
    spec = load_model("llama-3.1-8b", nvfp4())
    assert _mod(spec, "model.layers.0.mlp.up_proj").fmt.name == "nvfp4"
    assert _mod(spec, "lm_head").fmt.name == "bf16"
    assert spec.weight_bytes() < load_model("llama-3.1-8b").weight_bytes() / 2


def test_name_matcher_semantics():
    m = NameMatcher(["re:.*self_attn.*", "gate", "model.layers.*.mlp.router", "lm_head"])
    assert m("model.layers.3.self_attn.o_proj")
    assert m("model.layers.3.block_sparse_moe.gate")
    assert not m("model.layers.3.mlp.gate_proj")  # plain 'gate' is a whole name component
    assert m("model.layers.7.mlp.router")
    assert m("lm_head")
    assert not m("model.layers.3.mlp.experts.0.w1")


def test_unknown_quant_method_names_field():
    with pytest.raises(CeilingError, match="quant_method"):
        parse_quant({"quant_method": "bitsandbytes"}, "bfloat16")


def test_unsupported_compressed_tensors_scheme():
    qc = {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "g": {"targets": ["Linear"], "weights": {"num_bits": 6, "type": "float"}}
        },
    }
    with pytest.raises(CeilingError, match=r"config_groups\.g\.weights"):
        parse_quant(qc, "bfloat16")


def test_unknown_modelopt_algo():
    with pytest.raises(CeilingError, match="quant_algo"):
        parse_quant(None, "bfloat16", {"quantization": {"quant_algo": "W4A8_AWQ"}})


def test_awq_gptq_and_ct_fp8_configs_parse():
    awq_cfg = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
               "modules_to_not_convert": ["mlp.gate"]}  # fmt: skip
    s = parse_quant(awq_cfg, "float16")
    assert s.format_for("model.layers.0.self_attn.q_proj", "attn", True).name == "awq-int4-g128"
    assert s.format_for("model.layers.0.mlp.gate", "router", True).name == "fp16"
    g = parse_quant(
        {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True}, "bfloat16"
    )
    fmt = g.format_for("model.layers.0.mlp.down_proj", "mlp", True)
    # 4096 x 4096 g32: 8,388,608 + 524,288 groups * 2.5 B + 4096 cols * 4 B g_idx
    assert fmt.nbytes(4096, 4096) == 8_388_608 + 1_310_720 + 16_384
    ct = {
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"targets": ["re:.*mlp.*"],
                                "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}},
        "ignore": ["lm_head"],
    }  # fmt: skip
    c = parse_quant(ct, "bfloat16")
    assert c.format_for("model.layers.0.mlp.up_proj", "mlp", True).name == "fp8-channel"
    assert c.format_for("model.layers.0.self_attn.q_proj", "attn", True).name == "bf16"


QWEN36_NVFP4 = "src/ceiling/data/predict/reference/models/qwen3.6-35b-a3b-nvfp4"


def test_modelopt_mixed_precision_per_module_formats():
    """nvidia's ModelOpt MIXED_PRECISION export (verbatim config): each module in the format
    its quantized_layers entry names; lm_head in NVFP4 because the export names it."""
    spec = load_model(QWEN36_NVFP4)
    assert spec.quant.method == "modelopt" and spec.quant.kv_cache_dtype == "fp8"
    assert _mod(spec, "model.layers.0.linear_attn.in_proj_qkv").fmt.name == "fp8-tensor"
    assert _mod(spec, "model.layers.0.linear_attn.in_proj_z").fmt.name == "fp8-tensor"
    assert _mod(spec, "model.layers.0.linear_attn.in_proj_b").fmt.name == "bf16"  # not listed
    assert _mod(spec, "model.layers.3.self_attn.o_proj").fmt.name == "fp8-tensor"
    assert _mod(spec, "model.layers.0.mlp.experts.0.down_proj").fmt.name == "nvfp4"
    assert _mod(spec, "model.layers.0.mlp.gate").fmt.name == "bf16"  # router
    lm = _mod(spec, "lm_head")
    assert lm.fmt.name == "nvfp4" and lm.nbytes == 248320 * 2048 * 9 // 16 + 8


def test_compressed_tensors_module_name_targets():
    """config_groups targets may name modules (not only 're:' patterns or 'Linear')."""
    qc = {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "g": {
                "targets": ["model.language_model.layers.0.self_attn.q_proj", "lm_head"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"},
            }
        },
    }
    q = parse_quant(qc, "bfloat16")
    assert q.format_for("model.layers.0.self_attn.q_proj", "attn", True).name == "fp8-tensor"
    assert q.format_for("model.layers.1.self_attn.q_proj", "attn", True).name == "bf16"
    assert q.format_for("lm_head", "lm_head", False).name == "fp8-tensor"


def test_blanket_rules_leave_lm_head_unquantized():
    """A rule for every linear layer (AWQ, GPTQ, fp8 'Linear' targets) never covers lm_head."""
    qc = {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}
        },
    }
    q = parse_quant(qc, "bfloat16")
    assert q.format_for("lm_head", "lm_head", False).name == "bf16"
    assert q.format_for("model.layers.0.mlp.up_proj", "mlp", True).name != "bf16"
    assert _mod(load_model("kimi-k2.5-nvfp4"), "lm_head").fmt.name == "bf16"
