"""predict --engine llamacpp and calibrate --engine llamacpp (no GPU: GGUF headers written by
experiments/gpu/random_gguf.py --header-only, and the recorded H200 test-backend-ops / llama-bench
runs of experiments/results/2026-12-02_h200-llamacpp)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ceiling.errors import CeilingError
from ceiling.flows.calibrate_llamacpp import calibrate_cli
from ceiling.predict.gguf import bits_per_weight, read_gguf
from ceiling.predict.llamacpp import profile_from_sql
from ceiling.predict.llamacpp_files import load_kernels, predict_gguf

FIX = Path(__file__).parent / "fixtures" / "gguf"
# copies of that run's files (tests/fixtures/llamacpp_h200/README.md)
RES = Path(__file__).parent / "fixtures/llamacpp_h200"
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
    lc = p.details.llamacpp
    assert lc is not None
    assert lc.bytes_per_token == pytest.approx(want + lc.kv_bytes)
    assert p.bound is not None and p.bound.decode_ms_per_token < p.decode_ms_per_token


def test_graphs_off_and_flash_attention_off_cost_more() -> None:
    base = predict_gguf(DENSE, "h200", 4800.0).decode_ms_per_token
    assert predict_gguf(DENSE, "h200", 4800.0, cuda_graphs=False).decode_ms_per_token > base
    assert predict_gguf(DENSE, "h200", 4800.0, flash_attention=False).decode_ms_per_token > base


def test_the_recorded_test_backend_ops_run_is_a_profile(tmp_path: Path) -> None:
    prof = calibrate_cli(None, str(RES / "call2/perf-types.sql"), None, str(tmp_path / "p.json"))
    assert set(prof.matvec) == {"F16", "Q8_0", "Q6_K", "Q5_K", "Q4_K", "IQ4_XS"}
    assert prof.gpu is None  # this build leaves device_description empty: nothing invented
    # F16 streams near the H200's 4.8 TB/s; the K-quants' dequantizing mat-vec does not
    assert 3500 < prof.matvec["F16"].GBps < 4800
    assert prof.matvec["Q4_K"].GBps < 0.6 * prof.matvec["F16"].GBps
    # the one profile format: the kernels are the file's engine section's llamacpp entry
    written = json.loads((tmp_path / "p.json").read_text())
    assert written["schema_version"] == 2 and set(written["engine"]) == {"llamacpp"}
    assert load_kernels(tmp_path / "p.json") == prof
    with pytest.raises(CeilingError):
        profile_from_sql("CREATE TABLE x (a TEXT);\n")
    with pytest.raises(CeilingError):
        calibrate_cli(None, None, None, None)


def test_recorded_accuracy_on_the_h200_never_beats_the_bound() -> None:
    """experiments/validation/llamacpp_h200.py's recorded scores (ratchet: today's figures)."""
    rows = json.loads((RES / "predict_llamacpp.json").read_text())["rows"]
    scored = [r for r in rows if r["measured_ms"]]
    beside = [r for r in scored if r["role"] == "beside"]
    assert len(beside) == 3
    assert not any(r["measured_below_bound"] for r in scored)
    worst_profile = max(abs(r["profile_err_pct"]) for r in beside)
    worst_prior = max(abs(r["prior_err_pct"]) for r in beside)
    assert worst_profile <= 20.7 and worst_prior <= 26.3
    # held out (tests/test_llamacpp_heldout.py checks them apart): scored, never in a fit
    pre = json.loads((RES / "heldout_preregistered.json").read_text())["rows"]
    assert [r["file"] for r in scored if r["role"] == "held-out"] == [r["file"] for r in pre]


def test_predict_cli_needs_a_gguf(capsys: pytest.CaptureFixture[str]) -> None:
    from ceiling.cli import main

    assert main(["predict", "--engine", "llamacpp", "--gpu", "h200"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "fix: pass --gguf" in err


def test_predict_api_gives_the_shared_prediction_for_a_gguf() -> None:
    """engine llamacpp through predict(): the shared Prediction, its ops and evidence typed as
    every engine's, the GGUF specifics in details.llamacpp, the numbers predict_gguf's."""
    from ceiling.predict.api import Prediction, PredictRequest, predict

    req = PredictRequest(model=str(MOE), gpu="h200", engine="llamacpp", context=64)
    p = predict(req)
    assert isinstance(p, Prediction) and p.request == req
    assert p.decode_ms_per_token == predict_gguf(MOE, "h200", 4800.0, 64).decode_ms_per_token
    assert set(p.components_ms) == {"weights", "kv", "launch"}
    assert sum(p.components_ms.values()) == pytest.approx(p.decode_ms_per_token)
    assert p.expected is not None and p.bound is not None
    ops = {o.name: o for o in p.expected.ops}
    assert ops["weights Q4_K"].kernel == "mmvq" and ops["weights Q4_K"].source == "prior"
    assert ops["weights F32"].kernel == "mmvf"
    assert {o.source for o in p.bound.ops} == {"physics"}
    assert p.evidence.tables == "priors only"
    lc = p.details.llamacpp
    assert lc is not None and lc.arch == "qwen3moe" and lc.flash_attention
    assert {w.type for w in lc.weights} == {"Q4_K", "Q6_K", "F32"}
    assert p.details.weight_bytes_read_by_kind == {w.type: int(w.bytes) for w in lc.weights}
    assert p.model.experts == 8 and p.model.top_k == 2 and p.deployment.engine == "llamacpp"


def test_the_profile_marks_the_measured_types(tmp_path: Path) -> None:
    prof = calibrate_cli(None, str(RES / "call2/perf-types.sql"), None, str(tmp_path / "p.json"))
    p = predict_gguf(MOE, "h200", 4800.0, 64, profile=prof)
    assert p.expected is not None
    src = {o.name: o.source for o in p.expected.ops}
    assert src["weights Q4_K"] == src["weights Q6_K"] == "profile"
    assert src["weights F32"] == "prior"  # not timed by test-backend-ops: the prior stays
    assert p.evidence.tables and p.evidence.tables.startswith("llama.cpp kernels measured")


def test_predict_api_refuses_what_the_llamacpp_model_does_not_price() -> None:
    from ceiling.predict.api import PredictRequest, predict

    with pytest.raises(CeilingError, match="one stream on one GPU"):
        predict(PredictRequest(model=str(MOE), gpu="h200", engine="llamacpp", batch=4))
    with pytest.raises(CeilingError, match="GGUF"):
        predict(PredictRequest(model="llama-3.1-8b", gpu="h200", engine="llamacpp"))


def test_predict_cli_json_is_the_shared_prediction(capsys: pytest.CaptureFixture[str]) -> None:
    from ceiling.cli import main

    assert main(["predict", "--engine", "llamacpp", "--gguf", str(DENSE), "--gpu", "h200",
                 "--json"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "analytic" and doc["deployment"]["engine"] == "llamacpp"
    assert doc["details"]["llamacpp"]["weights"][0]["type"] == "F16"
    assert doc["bound"]["decode_ms_per_token"] < doc["decode_ms_per_token"]
