"""Inputs from the wild (issue 38): published configs accepted as their authors meant them, the
names ``--list-models`` shows accepted in any case with "did you mean", impossible shapes refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ceiling.cli import main
from ceiling.errors import CeilingError
from ceiling.spec.hardware import load_gpu
from ceiling.spec.model import catalog_name, is_model_input, list_models, load_model

#: Qwen3-Coder-480B-A35B-Instruct's published config.json (the fields the loader reads): no
#: shared expert, said as ``shared_expert_intermediate_size: 0``
QWEN3_CODER_480B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 6144,
    "intermediate_size": 8192,
    "max_position_embeddings": 262144,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 2560,
    "norm_topk_prob": True,
    "num_attention_heads": 96,
    "num_experts": 160,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 62,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000000,
    "shared_expert_intermediate_size": 0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def _write(tmp_path: Path, cfg: dict[str, object]) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_qwen3_coder_480b_zero_shared_expert_means_none(tmp_path: Path) -> None:
    spec = load_model(_write(tmp_path, QWEN3_CODER_480B))
    with_one = load_model(
        _write(tmp_path, {**QWEN3_CODER_480B, "shared_expert_intermediate_size": 2560})
    )
    # 480B total: 62 layers x 160 experts x 3 x 6144 x 2560 + attention + embeddings
    assert 470e9 < spec.total_params() < 490e9
    # one shared expert of 2560 per layer is 62 x 3 x 6144 x 2560 weights more
    assert with_one.total_params() - spec.total_params() == pytest.approx(62 * 3 * 6144 * 2560)


def test_qwen3_coder_480b_is_predicted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["predict", "--model", _write(tmp_path, QWEN3_CODER_480B), "--gpu", "h200",
               "--tp", "8", "--json"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err


def test_a_negative_shared_expert_width_is_still_refused(tmp_path: Path) -> None:
    with pytest.raises(CeilingError, match="shared_expert_intermediate_size"):
        load_model(_write(tmp_path, {**QWEN3_CODER_480B, "shared_expert_intermediate_size": -1}))


def test_heads_that_do_not_divide_by_the_kv_heads_are_refused(tmp_path: Path) -> None:
    cfg = json.loads(Path("src/ceiling/data/models/llama-3.1-8b.json").read_text())
    cfg["num_key_value_heads"] = 7
    with pytest.raises(CeilingError) as exc:
        load_model(_write(tmp_path, cfg))
    assert "32 attention heads and 7 KV heads" in exc.value.message
    assert "4 or 8" in exc.value.fix


def test_every_catalog_model_still_loads() -> None:
    for row in list_models():
        load_model(row["name"])


@pytest.mark.parametrize(
    "spelling",
    ["meta-llama/Llama-3.3-70B-Instruct", "META-LLAMA/llama-3.3-70b-instruct", "Llama-3.3-70B"],
)
def test_hf_ids_and_names_in_any_case_name_the_catalog_entry(spelling: str) -> None:
    assert catalog_name(spelling) == "llama-3.3-70b"
    assert is_model_input(spelling)
    assert load_model(spelling).name == "llama-3.3-70b"


def test_the_hf_id_list_models_shows_is_accepted_by_predict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(["predict", "--model", "meta-llama/Llama-3.3-70B-Instruct", "--gpu", "H200",
               "--tp", "4", "--json"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err


def test_a_near_miss_gets_did_you_mean() -> None:
    with pytest.raises(CeilingError) as exc:
        load_model("llama-3.3-70")
    assert "did you mean 'llama-3.3-70b'" in exc.value.message
    with pytest.raises(CeilingError) as exc:
        load_model("meta-llama/Llama-3.3-70B-Instruc")
    assert "'llama-3.3-70b' (meta-llama/Llama-3.3-70B-Instruct)" in exc.value.message
    with pytest.raises(CeilingError) as exc:
        load_gpu("h2000")
    assert "did you mean" in exc.value.message and "'h200'" in exc.value.message


def test_a_local_directory_wins_over_an_hf_id_of_the_same_spelling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = tmp_path / "meta-llama" / "Llama-3.3-70B-Instruct"
    local.mkdir(parents=True)
    cfg = json.loads(Path("src/ceiling/data/models/llama-3.1-8b.json").read_text())
    (local / "config.json").write_text(json.dumps(cfg))
    monkeypatch.chdir(tmp_path)
    assert load_model("meta-llama/Llama-3.3-70B-Instruct").num_layers == 32  # the 8B's
