"""predict --engine llamacpp without a file: --weight-format names a llama.cpp file type and
the tensor table is llama-quantize's mix for the model config (predict.gguf_mix,
data/predict/gguf_mixes.yaml, read from llama-quant.cpp's llama_tensor_get_type)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from ceiling.errors import CeilingError
from ceiling.predict.gguf import GgufInfo, kernel_data
from ceiling.predict.gguf_mix import mix_info, mixes, more_bits
from ceiling.predict.llamacpp import weights_read
from ceiling.spec.quant import GGUF_MIXES

FIX = Path(__file__).parent / "fixtures" / "gguf"
MODELS = Path(__file__).parent.parent / "src/ceiling/data/models"


def _types(info: GgufInfo) -> dict[str, str]:
    return {t.name: t.type for t in info.tensors}


def test_the_cli_names_are_the_data_files_mixes_and_every_type_has_a_block_layout() -> None:
    data = mixes()
    assert tuple(data.mixes) == GGUF_MIXES
    named = {m.default for m in data.mixes.values()} | set(data.fallback.values())
    named |= {r.type for m in data.mixes.values() for r in m.rules} | set(data.fallback)
    assert named <= set(kernel_data().types)


def test_q4_k_m_llama_8b_reads_what_the_recorded_header_holds() -> None:
    """The fixture is the header of the Q4_K_M file predict was validated on (H200 run of
    2026-12-02). That file was written by experiments/gpu/random_gguf.py, the project's own
    reading of the same llama.cpp rules, not by llama-quantize: this checks that the tensor table
    built from the catalog config (names, shapes, types) prices the file we measured, and that
    two readings of the rules agree; it is not evidence from llama.cpp itself."""
    hdr = GgufInfo.model_validate(
        json.loads((FIX / "header-llama3.1-8b-q4_k_m.json").read_text(encoding="utf-8"))
    )
    mine = mix_info("llama-3.1-8b", "q4_k_m")
    read = sum(t.nbytes * s for t, s in weights_read(mine))
    want = sum(t.nbytes * s for t, s in weights_read(hdr))
    assert read == pytest.approx(want, rel=0.02)
    assert _types(mine) == _types(hdr)


def test_q4_k_m_more_bits_layers_and_output() -> None:
    t = _types(mix_info("llama-3.1-8b", "q4_k_m"))
    six = [i for i in range(32) if t[f"blk.{i}.ffn_down.weight"] == "Q6_K"]
    # use_more_bits(i, 32): the first and last eighth, every third layer between
    assert six == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert six == [i for i in range(32) if t[f"blk.{i}.attn_v.weight"] == "Q6_K"]
    assert six == [i for i in range(32) if more_bits(i, 32)]
    assert t["output.weight"] == "Q6_K" and t["token_embd.weight"] == "Q4_K"
    assert {t[f"blk.{i}.attn_q.weight"] for i in range(32)} == {"Q4_K"}


def test_a_70b_model_lifts_its_remaining_q4_k_attn_v_to_q5_k() -> None:
    t = _types(mix_info("llama-3.1-70b", "q4_k_m"))
    v = [t[f"blk.{i}.attn_v.weight"] for i in range(80)]
    assert {v[i] for i in range(80) if more_bits(i, 80)} == {"Q6_K"}
    assert {v[i] for i in range(80) if not more_bits(i, 80)} == {"Q5_K"}
    # the 8B (not LLM_TYPE_70B) keeps them Q4_K
    t8 = _types(mix_info("llama-3.1-8b", "q4_k_m"))
    assert "Q4_K" in {t8[f"blk.{i}.attn_v.weight"] for i in range(32)}


def test_tied_embeddings_give_token_embd_the_outputs_type(tmp_path: Path) -> None:
    cfg = json.loads((MODELS / "qwen3-32b.json").read_text(encoding="utf-8"))
    cfg["tie_word_embeddings"] = True
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    t = _types(mix_info(str(path), "q4_k_m"))
    assert "output.weight" not in t and t["token_embd.weight"] == "Q6_K"


def test_an_eight_expert_model_gets_q8_0_attn_k_v_and_q5_k_attn_output(tmp_path: Path) -> None:
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 1024, "num_hidden_layers": 8,
           "vocab_size": 4096, "num_attention_heads": 16, "num_key_value_heads": 4,
           "head_dim": 64, "num_experts": 8, "num_experts_per_tok": 2,
           "moe_intermediate_size": 512, "intermediate_size": 2048, "torch_dtype": "bfloat16"}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    for mix, out in (("q4_k_m", "Q5_K"), ("iq4_xs", "Q5_K"), ("q5_k_m", "Q5_K"), ("q6_k", "Q6_K")):
        t = _types(mix_info(str(path), mix))
        assert {t[f"blk.{i}.attn_k.weight"] for i in range(8)} == {"Q8_0"}, mix
        assert {t[f"blk.{i}.attn_v.weight"] for i in range(8)} == {"Q8_0"}, mix
        assert {t[f"blk.{i}.attn_output.weight"] for i in range(8)} == {out}, mix
    # a 128-expert model is no 8-expert model
    t = _types(mix_info("qwen3-30b-a3b", "q4_k_m"))
    assert t["blk.5.attn_k.weight"] == "Q4_K" and t["blk.0.ffn_down_exps.weight"] == "Q6_K"


def test_iq4_xs_q5_k_attn_v_with_four_query_heads_per_kv_and_the_first_eighth_down() -> None:
    t = _types(mix_info("llama-3.1-8b", "iq4_xs"))  # 32 heads over 8 KV heads
    assert {t[f"blk.{i}.attn_v.weight"] for i in range(32)} == {"Q5_K"}
    assert [t[f"blk.{i}.ffn_down.weight"] for i in range(5)] == ["Q5_K"] * 4 + ["IQ4_XS"]
    assert t["output.weight"] == "Q6_K" and t["blk.9.ffn_up.weight"] == "IQ4_XS"


def test_q6_k_q8_0_f16_are_one_type_throughout() -> None:
    for mix, typ in (("q6_k", "Q6_K"), ("q8_0", "Q8_0"), ("f16", "F16")):
        counts = Counter(t.type for t in mix_info("llama-3.1-8b", mix).tensors)
        assert set(counts) == {typ, "F32"}, mix  # norms stay F32
        assert counts["F32"] == 65
    assert _types(mix_info("llama-3.1-8b", "q8_0"))["output.weight"] == "Q8_0"


def test_q5_k_m_is_q4_k_m_on_q5_k() -> None:
    q4 = _types(mix_info("llama-3.1-8b", "q4_k_m"))
    q5 = _types(mix_info("llama-3.1-8b", "q5_k_m"))
    assert {n: ("Q5_K" if v == "Q4_K" else v) for n, v in q4.items()} == q5


def test_a_row_no_block_divides_falls_back(tmp_path: Path) -> None:
    """tensor_type_fallback: 2880 is no multiple of 256 (Q4_K, Q6_K) but of 32."""
    cfg = json.loads((MODELS / "llama-3.1-8b.json").read_text(encoding="utf-8"))
    cfg |= {"hidden_size": 2880, "num_attention_heads": 45, "num_key_value_heads": 9,
            "head_dim": 64}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    t = _types(mix_info(str(path), "q4_k_m"))
    assert t["blk.10.attn_q.weight"] == "Q5_0" and t["output.weight"] == "Q8_0"
    assert t["blk.0.ffn_down.weight"] == "Q6_K"  # its row is 14336 = 56 x 256


def test_what_has_no_mix_is_refused_naming_what_is_accepted() -> None:
    with pytest.raises(CeilingError) as err:
        mix_info("llama-3.1-8b", "fp8")
    assert "q4_k_m" in err.value.fix and "iq4_xs" in err.value.fix
    with pytest.raises(CeilingError, match="--gguf"):
        mix_info("deepseek-v3", "q4_k_m")  # MLA: other tensors


def test_predict_prices_a_mix_without_a_file_and_says_so() -> None:
    from ceiling.predict.api import PredictRequest, predict

    req = PredictRequest(model="llama-3.1-8b", gpu="h200", engine="llamacpp",
                         weight_format="q4_k_m")  # fmt: skip
    p = predict(req)
    lc = p.details.llamacpp
    assert lc is not None and {w.type for w in lc.weights} == {"Q4_K", "Q6_K"}
    assert any("llama-quantize Q4_K_M" in a for a in p.assumptions)
    q8 = predict(req.model_copy(update={"weight_format": "q8_0"}))
    assert q8.decode_ms_per_token > p.decode_ms_per_token  # more bytes per token
    with pytest.raises(CeilingError, match="q4_k_m"):
        predict(req.model_copy(update={"weight_format": "nvfp4"}))
    with pytest.raises(CeilingError, match=r"llama\.cpp file type"):
        predict(req.model_copy(update={"engine": "vllm"}))


def test_the_cli_takes_a_gguf_type_for_llamacpp_and_names_them_otherwise(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ceiling.cli import main

    args = ["predict", "--engine", "llamacpp", "--model", "llama-3.1-8b", "--gpu", "h200"]
    assert main([*args, "--weight-format", "q6_k", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {w["type"] for w in doc["details"]["llamacpp"]["weights"]} == {"Q6_K"}
    assert main([*args, "--weight-format", "fp8"]) == 2
    err = capsys.readouterr().err
    assert "q4_k_m, q5_k_m, q6_k, q8_0, f16, iq4_xs" in err
    assert main([*args]) == 2 and "--weight-format q4_k_m|" in capsys.readouterr().err
