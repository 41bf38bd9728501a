"""Every forecast says how sure it is (issue 39, deliverable 1): an 80 % interval on expected's
step and tok/s, in the JSON, the text, the what-if table and the batch curve, with a one-line
reason; its width follows the evidence ladder and what predict cannot express for the setup;
its spreads come from data/predict/intervals.yaml, fitted leave-one-setup-out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ceiling.cli import main
from ceiling.predict.api import PredictRequest, predict
from ceiling.predict.interval import LEVELS, Features, intervals, sigma
from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
H200_LLAMA = ["predict", "--model", "llama-3.1-8b", "--gpu", "h200"]


def _ordered(lo: float | None, mid: float, hi: float | None) -> None:
    assert lo is not None and hi is not None
    assert lo < mid < hi


def test_interval_present_and_ordered_for_step_and_tok_s():
    p = predict(PredictRequest(model="llama-3.1-8b", gpu="h200", batch=8))
    iv = p.expected.interval
    assert iv is not None and iv.coverage == 0.8
    _ordered(iv.step_ms_low, p.decode_ms_per_token, iv.step_ms_high)
    _ordered(iv.tok_s_low, p.decode_tok_s_per_stream, iv.tok_s_high)
    assert iv.tok_s_low == pytest.approx(1000 / iv.step_ms_high, rel=1e-3)
    assert iv.reason


def test_batch_curve_and_what_if_rows_carry_the_interval():
    p = predict(PredictRequest(model="llama-3.1-8b", gpu="h200", what_if=True))
    assert p.batch_curve
    for pt in p.batch_curve:
        _ordered(pt.step_ms_low, pt.step_ms, pt.step_ms_high)
        _ordered(pt.tok_s_per_stream_low, pt.tok_s_per_stream, pt.tok_s_per_stream_high)
    ran = [w for w in p.what_if if w.decode_tok_s_per_stream > 0]
    assert ran
    for w in ran:
        _ordered(w.tok_s_low, w.decode_tok_s_per_stream, w.tok_s_high)


def test_json_keys(capsys):
    assert main([*H200_LLAMA, "--what-if", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    keys = {"coverage", "step_ms_low", "step_ms_high", "tok_s_low", "tok_s_high", "reason"}
    assert keys <= set(d["expected"]["interval"])
    assert d["bound"]["interval"] is None  # the bound is physics, not a forecast
    assert {"step_ms_low", "tok_s_per_stream_high"} <= set(d["batch_curve"][0])
    assert any(w["tok_s_low"] for w in d["what_if"])


def test_text_output_prints_interval_reason_and_columns(capsys):
    assert main([*H200_LLAMA, "--what-if"]) == 0
    text = capsys.readouterr().out
    assert "80 % interval:" in text and "wider for:" in text
    assert "ms/step (80 %)" in text  # the batch curve: the interval in the cell


def test_width_grows_down_the_evidence_ladder():
    data = intervals()
    widths = [
        sigma(Features(shares={lvl: 1.0}, engine="vllm", factors=[], gpu="h200", prior_ops=[]))[0]
        for lvl in ("trace", "profile", "table", "prior", "prior_borrowed")
    ]
    assert widths == sorted(widths) and widths[0] < widths[-1]
    assert set(data.levels) == set(LEVELS)


def test_setup_factors_widen_and_are_named():
    base = Features(shares={"table": 1.0}, engine="vllm", factors=[], gpu="b200", prior_ops=[])
    for fac in ("spec_decoding", "attention_dp", "gpu_vendor"):
        wider = base.model_copy(update={"factors": [fac]})
        assert sigma(wider)[0] > sigma(base)[0], fac


def test_priors_on_an_unmeasured_gpu_are_wider_and_say_why():
    amd = predict(PredictRequest(model="qwen3-30b-a3b", gpu="mi300x", engine="sglang"))
    nv = predict(PredictRequest(model="qwen3-30b-a3b", gpu="h200", engine="sglang"))
    a, n = amd.expected.interval, nv.expected.interval
    assert a.spread > n.spread
    assert "mi300x" in a.reason and "priors" in a.reason and "no measured profile" in a.reason
    assert "MoE" in a.reason


def test_calibration_file_records_leave_one_setup_out_coverage():
    d = intervals()
    loo = d.leave_one_setup_out
    assert d.produced_by == "experiments/validation/calibrate_intervals.py"
    assert (ROOT / d.produced_by).exists()
    assert loo.setups > 10 and loo.rows > 50 and 0 < loo.coverage <= 1
    assert set(loo.by_set) == set(loo.rows_by_set)
    assert any(s.calibrated for s in d.levels.values())


def test_a_left_out_setup_never_shapes_its_own_interval():
    """Leave-one-setup-out: the interval a setup is scored with does not move when its own
    errors do (it is fitted on the others only)."""
    cal = load_script(ROOT / "experiments/validation/calibrate_intervals.py")

    def rows(err_of_a: float) -> list:
        out = []
        for i, (setup, err) in enumerate(
            [("A", err_of_a), ("B", 0.1), ("B", -0.2), ("C", 0.3), ("C", -0.1), ("D", 0.05)]
        ):
            f = Features(shares={"table": 0.7, "prior": 0.3}, engine="vllm", factors=[],
                         gpu="h200", prior_ops=[])  # fmt: skip
            out.append(cal.Row(id=str(i), set="s", setup=setup, err=err, f=f))
        return out

    def width_of_a(err: float) -> float:
        _, scored = cal.loo(rows(err))
        return next(w for r, _, w in scored if r.setup == "A")

    assert width_of_a(0.01) == pytest.approx(width_of_a(2.0))
