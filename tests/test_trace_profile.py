"""A trace's split as predict evidence: ``to_profile`` -> ``predict --profile`` (source trace)."""

from __future__ import annotations

import pytest
from tests.trace_synth import Synth

from ceiling.predict.api import predict
from ceiling.predict.schema import PredictRequest
from ceiling.spec.profile import load_profile, save_profile
from ceiling.trace import read_trace, split
from ceiling.trace.profile import to_profile

# one Llama-3.1-8B decode step's worth of kernel classes (per step: 0.6 ms of GEMMs etc.)
STEP = [
    ("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT", 600.0),
    ("void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>(x)", 90.0),
    ("void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(x)", 30.0),
    ("Memcpy DtoH (Device -> Pinned)", 4.0),
]
REQ = dict(model="llama-3.1-8b", gpu="h200", engine="vllm", batch=1, context=1024)


def _profile(tmp_path, annotation="execute_context_0(0)_generation_1(1)", **kw):
    s = Synth()
    for _ in range(5):
        s.gpu_step(STEP, annotation, gap=200.0)
    sp = split([read_trace(s.write(tmp_path / "t.json"))], "vllm")
    return sp, save_profile(to_profile(sp, **kw), tmp_path / "p.json")


def _rows(pred):
    return {o.name: o for o in pred.expected.ops}


def test_trace_ops_replace_the_evidence_of_the_ops_they_time(tmp_path):
    sp, path = _profile(tmp_path)
    assert sp.batch == 1
    prof = load_profile(path)
    assert {t.op_class for t in prof.trace_ops} == {"gemm", "attention", "norm", "idle"}
    base = predict(PredictRequest(**REQ))
    got = predict(PredictRequest(**REQ, profile=str(path)))
    rows, before = _rows(got), _rows(base)
    gemms = [n for n in rows if n in ("attn.qkv_proj", "attn.o_proj", "mlp.gate_up", "mlp.down",
                                      "lm_head")]  # fmt: skip
    assert len(gemms) == 5 and all(rows[n].source == "trace" for n in gemms)
    # the group keeps the model's shares and takes the measured total
    assert sum(rows[n].ms for n in gemms) == pytest.approx(0.6, rel=1e-3)
    share = rows["mlp.down"].ms / rows["mlp.gate_up"].ms
    assert share == pytest.approx(before["mlp.down"].ms / before["mlp.gate_up"].ms, rel=1e-3)
    assert rows["attention.decode"].source == "trace"
    assert rows["attention.decode"].ms == pytest.approx(0.09, rel=1e-3)
    assert rows["host"].source == "trace" and rows["host"].ms == pytest.approx(0.2, rel=1e-3)
    # ops the trace did not see keep their previous evidence
    assert rows["sampling"].source == before["sampling"].source != "trace"
    assert rows["embedding"].ms == pytest.approx(before["embedding"].ms)
    assert any("ops timed by the engine's trace" in a for a in got.assumptions)
    assert "trace" in got.evidence.share_of_expected_by_source


def test_trace_ops_apply_only_at_their_batch(tmp_path):
    _, path = _profile(tmp_path, annotation="execute_context_0(0)_generation_4(4)")
    got = predict(PredictRequest(**REQ, profile=str(path)))
    assert all(o.source != "trace" for o in got.expected.ops)
    assert any("recorded at batch 4, not 1" in a for a in got.assumptions)
    at4 = predict(PredictRequest(**{**REQ, "batch": 4}, profile=str(path)))
    assert any(o.source == "trace" for o in at4.expected.ops)


def test_to_profile_merges_into_a_calibrate_profile(tmp_path):
    from ceiling.spec.profile import HardwareProfile

    sp, _ = _profile(tmp_path)
    base = HardwareProfile(mem_bw_GBps=4200.0, gpu="h200")
    merged = to_profile(sp, base=base, batch=1)
    assert merged.mem_bw_GBps == 4200.0 and merged.trace_ops
    assert any("decode steps" in n for n in merged.notes)


def test_attention_from_another_context_is_not_used(tmp_path):
    # the detailed vLLM annotation says the context: 1 sequence of 8192 tokens
    ann = "execute_1_context_0(sq0sk0sqsq0sqsk0)_generation_1(sq1sk8192sqsq1sqsk8192)"
    sp, path = _profile(tmp_path, annotation=ann)
    assert sp.batch == 1 and sp.context == 8192
    got = predict(PredictRequest(**REQ, profile=str(path)))  # context 1024
    rows = _rows(got)
    assert rows["attention.decode"].source != "trace"
    assert rows["mlp.gate_up"].source == "trace"  # GEMMs do not depend on the context
    assert any("recorded at context 8192, not 1024" in a for a in got.assumptions)
    at = predict(PredictRequest(**{**REQ, "context": 8192}, profile=str(path)))
    assert _rows(at)["attention.decode"].source == "trace"
