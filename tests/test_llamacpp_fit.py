"""predict.llamacpp_fit: llama.cpp's mat-vec t0 + bytes / rate per type, from per-op rows."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ceiling.predict.llamacpp import profile_from_sql
from ceiling.predict.llamacpp_files import predict_gguf
from ceiling.predict.llamacpp_fit import MatvecPoint, fit_dense, fit_points, points_from_sql

ROOT = Path(__file__).resolve().parents[1]
OPS = ROOT / "tests/fixtures/llamacpp_ops"  # copies of experiments/gpu/ops (see its README)
FAKE = ROOT / "experiments/gpu/fake_llamacpp.sh"


def _pt(nbytes: float, t0: float, gbps: float, op: str = "MUL_MAT") -> MatvecPoint:
    return MatvecPoint(op=op, type="Q4_K", k=4096, m=1024, bytes=nbytes,
                       time_us=t0 + nbytes / (gbps * 1e3))  # fmt: skip


def test_fit_recovers_fixed_cost_and_rate() -> None:
    pts = [_pt(b, 3.1, 2100.0) for b in (2.4e6, 9.4e6, 33e6, 295e6)]
    f = fit_dense("Q4_K", pts)
    assert f is not None
    assert f.t0_us == pytest.approx(3.1) and f.GBps == pytest.approx(2100.0)
    assert f.max_resid_pct == pytest.approx(0.0, abs=1e-9) and f.points == 4


def test_one_size_cannot_separate_t0_from_the_rate() -> None:
    assert fit_dense("Q4_K", [_pt(2.4e6, 3.0, 2000.0), _pt(2.4e6, 3.0, 2000.0)]) is None


def test_a_negative_fixed_cost_is_clamped_to_the_rate_alone() -> None:
    # faster small matrices than the line through the big ones: no t0 < 0 is ever used
    pts = [MatvecPoint(op="MUL_MAT", type="F16", k=1, m=1, bytes=b, time_us=t)
           for b, t in ((1e6, 0.2), (1e8, 30.0))]  # fmt: skip
    f = fit_dense("F16", pts)
    assert f is not None and f.t0_us == 0.0 and f.GBps > 0


def test_experts_borrow_the_dense_t0_of_their_type() -> None:
    dense = [_pt(b, 3.0, 2000.0) for b in (2e6, 3e7)]
    routed = [_pt(7e6, 0.0, 1000.0, op="MUL_MAT_ID")]
    routed[0].time_us = 3.0 + 7e6 / 1.4e6  # 3 us + 7 MB at 1400 GB/s
    d, e = fit_points(dense + routed)
    assert e["Q4_K"].t0_us == d["Q4_K"].t0_us == pytest.approx(3.0)
    assert e["Q4_K"].GBps == pytest.approx(1400.0) and e["Q4_K"].t0_from == "MUL_MAT"


def _fake_sql(name: str) -> str:
    """test-backend-ops SQL of the fake binary (experiments/gpu/fake_llamacpp.sh) on an op file."""
    link = Path(tempfile.mkdtemp()) / "test-backend-ops"  # the fake answers by its name
    link.symlink_to(FAKE)
    out = subprocess.run(["bash", str(link), "perf", "-b", "CUDA0", "--test-file",
                          str(OPS / name), "--output", "sql"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout


def test_the_op_files_parse_as_one_token_mat_vecs() -> None:
    """Every line of the decode-shape op files is a one-token MUL_MAT(_ID) the fit reads, with
    the bytes of its GGUF type (the fake binary prints the real SQL layout)."""
    pts = points_from_sql(_fake_sql("matvec-qwen3-30b-a3b.txt"))
    assert len(pts) == 24
    ids = [p for p in pts if p.op == "MUL_MAT_ID"]
    assert len(ids) == 8 and {p.used for p in ids} == {8}
    q4 = next(p for p in ids if p.type == "Q4_K" and p.k == 2048)
    assert q4.bytes == 8 * 2048 * 768 * 4.5 / 8  # the 8 routed experts' matrices
    pts8 = points_from_sql(_fake_sql("matvec-llama3.1-8b.txt"))
    pts8 += points_from_sql(_fake_sql("matvec-extra-llama3.1-8b.txt"))
    assert {p.type for p in pts8} == {"Q4_K", "Q6_K", "Q8_0", "F16", "Q5_K", "IQ4_XS"}
    assert all(len([p for p in pts8 if p.type == t]) == 5 for t in {p.type for p in pts8})


def test_a_fitted_profile_adds_each_matrix_fixed_cost(tmp_path: Path) -> None:
    """With the decode-shape fits the step counts one t0 per matrix read: an 8B file's 225
    mat-vecs cost more than its bytes at the rate alone."""
    from ceiling.spec.hardware import load_gpu

    sql = (ROOT / "tests/fixtures/llamacpp_h200/call2/perf-types.sql").read_text()
    text = sql + "\n" + _fake_sql("matvec-llama3.1-8b.txt")
    prof = profile_from_sql(text, with_fits=True)
    assert set(prof.matvec_fit) == {"Q4_K", "Q6_K", "Q8_0", "F16"} and not prof.expert_fit
    gg = tmp_path / "m.gguf"
    subprocess.run([sys.executable, str(ROOT / "experiments/gpu/random_gguf.py"),
                    "--shape", "llama3.1-8b", "--ftype", "q4_k_m", "--out", str(gg),
                    "--header-only"], check=True, capture_output=True)  # fmt: skip
    bw = load_gpu("h200").mem_bw_GBps
    p = predict_gguf(gg, "h200", bw, 64, profile=prof)
    assert p.expected is not None
    w = {o.name: o for o in p.expected.ops}["weights Q4_K"]
    assert w.source == "profile" and "fit" in (w.note or "")
    f = prof.matvec_fit["Q4_K"]
    nbytes = p.details.weight_bytes_read_by_kind["Q4_K"]
    # the embedding (Q4_K here) is one row's get_rows: no mat-vec fixed cost
    fixed = (w.count - 1) * f.t0_us
    assert w.ms * 1e3 == pytest.approx(fixed + nbytes / (f.GBps * 1e3), rel=1e-6)
