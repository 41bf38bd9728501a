"""predict --engine llamacpp and calibrate --engine llamacpp (no GPU: GGUF headers written by
bench/gpu/random_gguf.py --header-only, and the recorded H200 test-backend-ops / llama-bench
runs of bench/results/2026-12-02_h200-llamacpp)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ceiling.errors import CeilingError
from ceiling.predict.llamacpp import (
    bits_per_weight,
    calibrate_cli,
    predict_gguf,
    profile_from_sql,
    read_gguf,
)

FIX = Path(__file__).parent / "fixtures" / "gguf"
RES = Path(__file__).parent.parent / "bench/results/2026-12-02_h200-llamacpp"
MOE = FIX / "tiny-moe-q4_k_m.header.gguf"
DENSE = FIX / "tiny-llama-f16.header.gguf"


def test_bits_per_weight_from_the_block_layouts() -> None:
    got = {t: bits_per_weight(t) for t in ("F16", "Q8_0", "Q6_K", "Q5_K", "Q4_K", "IQ4_XS")}
    assert got == {"F16": 16, "Q8_0": 8.5, "Q6_K": 6.5625, "Q5_K": 5.5, "Q4_K": 4.5,
                   "IQ4_XS": 4.25}  # fmt: skip
    with pytest.raises(CeilingError):
        bits_per_weight("Q9_X")


def test_the_header_names_the_types_and_the_experts() -> None:
    info = read_gguf(MOE)
    assert info.arch == "qwen3moe" and info.key("expert_count") == 8
    assert info.key("expert_used_count") == 2
    types = {t.name: t.type for t in info.tensors}
    # llama.cpp's use_more_bits(i, 4 layers): layers 2 and 3 get Q6_K down projections
    downs = [types[f"blk.{i}.ffn_down_exps.weight"] for i in range(4)]
    assert downs == ["Q4_K", "Q4_K", "Q6_K", "Q6_K"]
    assert types["blk.0.ffn_gate_inp.weight"] == "F32" and types["output.weight"] == "Q6_K"
    exps = next(t for t in info.tensors if t.name == "blk.1.ffn_up_exps.weight")
    assert exps.shape == [256, 256, 8]  # ggml order: cols, rows, experts


def test_moe_reads_only_the_routed_experts() -> None:
    info = read_gguf(MOE)
    p = predict_gguf(MOE, "h200", 4800.0, context=64)
    by = {t.name: t for t in info.tensors}
    exp_bytes = sum(t.nbytes for n, t in by.items() if "_exps." in n)
    full = sum(t.nbytes for n, t in by.items() if n.endswith(".weight") and len(t.shape) >= 2)
    emb = by["token_embd.weight"]
    # 2 of 8 experts per layer, one embedding row, every other matrix whole
    want = full - exp_bytes * (1 - 2 / 8) - emb.nbytes * (1 - 1 / emb.shape[1])
    kv = next(x for x in p.parts if x.name.startswith("KV")).bytes
    assert p.bytes_per_token == pytest.approx(want + kv)
    assert p.bound_ms < p.step_ms


def test_graphs_off_and_flash_attention_off_cost_more() -> None:
    base = predict_gguf(DENSE, "h200", 4800.0)
    assert predict_gguf(DENSE, "h200", 4800.0, cuda_graphs=False).step_ms > base.step_ms
    assert predict_gguf(DENSE, "h200", 4800.0, flash_attention=False).step_ms > base.step_ms


def test_the_recorded_test_backend_ops_run_is_a_profile(tmp_path: Path) -> None:
    prof = calibrate_cli(None, str(RES / "call2/perf-types.sql"), None, str(tmp_path / "p.json"))
    assert set(prof.matvec) == {"F16", "Q8_0", "Q6_K", "Q5_K", "Q4_K", "IQ4_XS"}
    assert prof.gpu is None  # this build leaves device_description empty: nothing invented
    # F16 streams near the H200's 4.8 TB/s; the K-quants' dequantizing mat-vec does not
    assert 3500 < prof.matvec["F16"].GBps < 4800
    assert prof.matvec["Q4_K"].GBps < 0.6 * prof.matvec["F16"].GBps
    assert json.loads((tmp_path / "p.json").read_text())["kind"] == "llamacpp-kernels"
    with pytest.raises(CeilingError):
        profile_from_sql("CREATE TABLE x (a TEXT);\n")
    with pytest.raises(CeilingError):
        calibrate_cli(None, None, None, None)


def test_recorded_accuracy_on_the_h200_never_beats_the_bound() -> None:
    """bench/validation/llamacpp_h200.py's recorded scores (ratchet: today's figures)."""
    rows = json.loads((RES / "predict_llamacpp.json").read_text())["rows"]
    scored = [r for r in rows if r["measured_ms"]]
    assert len(scored) == 3
    assert not any(r["measured_below_bound"] for r in scored)
    worst_profile = max(abs(r["profile_err_pct"]) for r in scored)
    worst_prior = max(abs(r["prior_err_pct"]) for r in scored)
    assert worst_profile <= 20.7 and worst_prior <= 26.3


def test_predict_cli_needs_a_gguf(capsys: pytest.CaptureFixture[str]) -> None:
    from ceiling.cli import main

    assert main(["predict", "--engine", "llamacpp", "--gpu", "h200"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "fix: pass --gguf" in err
