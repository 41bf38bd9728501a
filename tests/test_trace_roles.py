"""GEMMs by layer role from their positions (trace.roles), on the real H200 traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from ceiling.predict.api import predict
from ceiling.predict.schema import PredictRequest
from ceiling.trace import read_trace, split
from ceiling.trace.profile import to_profile
from ceiling.trace.roles import assign

FIX = Path(__file__).parent / "fixtures" / "trace"


def _pred(model: str):
    return predict(PredictRequest(model=model, gpu="h200", engine="generic"))


def test_a_dense_model_gets_its_gemms_by_role():
    sp = split([read_trace(FIX / "h200-llama-3.1-8b-b1-graph.pt.trace.json.gz")])
    assert len(sp.gemm_calls_ms) == 32 * 4 + 1
    out = assign(sp, _pred("llama-3.1-8b"))
    got = {c.op_class: c for c in out.classes}
    assert "gemm" not in got
    assert {"gemm_qkv", "gemm_o", "gemm_gate_up", "gemm_down", "gemm_lm_head"} <= set(got)
    assert got["gemm_qkv"].calls == 32 and got["gemm_lm_head"].calls == 1
    # Llama-3.1-8B per layer: gate_up 235 MB > down 117 MB > qkv 50 MB > o 34 MB of weights
    ms = [got[r].ms for r in ("gemm_gate_up", "gemm_down", "gemm_qkv", "gemm_o")]
    assert ms == sorted(ms, reverse=True)
    assert sum(got[r].ms for r in got if r.startswith("gemm_")) == pytest.approx(
        sp.class_ms("gemm"), rel=1e-4
    )
    assert sum(c.ms for c in out.classes) + out.idle_ms == pytest.approx(out.step_ms, rel=1e-5)
    prof = to_profile(out, batch=1)
    qkv = next(t for t in prof.trace_ops if t.op_class == "gemm_qkv")
    assert qkv.ops == ["attn.qkv_proj"] and not qkv.group


def test_positions_that_do_not_match_keep_one_gemm_class():
    sp = split([read_trace(FIX / "h200-qwen3-30b-a3b-b1-graph.pt.trace.json.gz")])
    out = assign(sp, _pred("qwen3-30b-a3b"))  # eager MoE experts run as many cuBLAS GEMMs
    assert out.class_ms("gemm") == sp.class_ms("gemm")
    assert any(n.startswith("GEMM roles not split:") for n in out.notes)
    llama = split([read_trace(FIX / "h200-llama-3.1-8b-b1-graph.pt.trace.json.gz")])
    other = assign(llama, _pred("qwen3-32b"))  # 64 layers: 257 GEMM calls, the trace has 129
    assert any("129 GEMM calls per step, predict runs 257" in n for n in other.notes)


def test_doctor_verdict_split_has_gemm_roles():
    from ceiling.diagnose.judge import traced_split
    from ceiling.report import load_doc
    from ceiling.trace.capture import TraceCapture

    doc = load_doc(Path(__file__).parent / "data" / "report" / "doctor-cpu.json")
    doc.prediction = _pred("llama-3.1-8b")
    sp = split([read_trace(FIX / "h200-llama-3.1-8b-b1-graph.pt.trace.json.gz")])
    doc.traces = [TraceCapture(url="http://127.0.0.1:1", engine="generic", steps_asked=4,
                               recorded=True, files=["t.json.gz"], split=sp)]  # fmt: skip
    ms = traced_split(doc)
    assert ms is not None
    rows = {r.op_class for r in ms.rows}
    assert {"gemm_gate_up", "gemm_down", "gemm_qkv", "gemm_o", "gemm_lm_head"} <= rows
