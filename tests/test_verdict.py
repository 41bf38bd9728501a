"""Verdict: statements traceable to numbers; hypotheses answered only with evidence."""

from __future__ import annotations

import pytest

from ceiling.diagnose.attribute import attribute, attribute_levels
from ceiling.diagnose.verdict import VerdictInputs, build_verdict


def _gpu_inputs(**kw):
    a = attribute(
        12.3,
        {"weights": 7.0, "kv": 0.5, "collectives": 2.0, "launch": 0.3, "host": 0.2},
        basis="predict",
    )
    pred = {
        "decode_tok_s_per_stream": 1000 / 10.0,
        "what_if": [
            {
                "change": "custom one-shot allreduce",
                "decode_tok_s_per_stream": 108.0,
                "delta_pct": 8.0,
            },
            {"change": "NCCL_PROTO=LL", "decode_tok_s_per_stream": 100.5, "delta_pct": 0.5},
            {"change": "TP=4 + DP=2", "decode_tok_s_per_stream": 95.0, "delta_pct": -5.0},
        ],
    }
    base = dict(
        attribution=a,
        measured_tok_s=81.4,
        measured_ci=(80.9, 81.9),
        prediction=pred,
        hardware_kind="gpu",
        tp=8,
        hidden_size=7168,
    )
    base.update(kw)
    return VerdictInputs(**base)


def test_nccl_hypothesis_is_latency_bound_at_14_kb():
    v = build_verdict(_gpu_inputs())
    h = next(h for h in v.hypotheses if h.hypothesis.startswith("NCCL"))
    assert "latency-bound at 14 KB" in h.answer
    assert h.predicted_gain_pct == pytest.approx(0.5)


def test_changes_ranked_by_gain_and_best_config():
    v = build_verdict(
        _gpu_inputs(
            findings=[
                {
                    "id": "B1",
                    "kind": "configurable",
                    "fix": "remove --enforce-eager",
                    "title": "eager",
                    "predicted_effect": "launch overhead",
                    "evidence": ["enforce_eager=True"],
                },
                {"id": "A9", "kind": "fundamental", "fix": "new fabric", "title": "x"},
            ]
        )
    )
    assert [c.change for c in v.changes][:2] == ["custom one-shot allreduce", "NCCL_PROTO=LL"]
    assert all(c.change != "TP=4 + DP=2" for c in v.changes)  # negative gain is not a change
    assert any(c.source == "finding B1" for c in v.changes)
    assert not any("new fabric" in c.change for c in v.changes)  # fundamental finding
    assert v.best_config == {"change": "custom one-shot allreduce", "tok_s": 108.0}
    assert v.pct_of_predicted == pytest.approx(81.4)
    assert v.gap["unexplained_ms"] == pytest.approx(2.3)


def test_target_met_missed_and_ci_caveat():
    assert build_verdict(_gpu_inputs(target_tok_s=80.0)).target.met
    t = build_verdict(_gpu_inputs(target_tok_s=81.0)).target
    assert t.met and "on the mean only" in t.text
    t = build_verdict(_gpu_inputs(target_tok_s=120.0)).target
    assert not t.met and t.margin_pct == pytest.approx(100 * (81.4 / 120 - 1))
    assert "below the target" in t.text  # predicted 100 < 120: no setting reaches it
    assert build_verdict(_gpu_inputs()).target is None


def test_cpu_host_bound_headline_and_flag_answer():
    a = attribute(4.0, {"weights": 0.12, "kv": 0.01, "compute": 0.05}, basis="cpu")
    lv = attribute_levels([(1, 4.0, {"weights": 0.12}, 240.0), (2, 4.1, {"weights": 0.12}, 470.0)])
    v = build_verdict(
        VerdictInputs(
            attribution=a,
            measured_tok_s=250.0,
            hardware_kind="cpu",
            levels=lv,
            flag_checks={
                "--num-scheduler-steps": "unrecognized argument",
                "--async-scheduling": None,
            },
        )
    )
    assert v.headline.startswith("Host / launch-overhead-bound, not bandwidth-bound")
    assert "95.5 %" in v.headline
    hyp = {h.hypothesis: h.answer for h in v.hypotheses}
    assert hyp["`--num-scheduler-steps`"].startswith("not in the installed engine")
    assert hyp["`--async-scheduling`"].startswith("accepted")
    assert "not applicable" in next(a for k, a in hyp.items() if k.startswith("NCCL"))
    streams = next(h for k, h in zip(hyp, v.hypotheses, strict=True) if "streams" in k)
    # decode rate summed over streams: 2 x 1000 / 4.1 ms vs 1000 / 4.0 ms
    assert streams.predicted_gain_pct == pytest.approx(100 * ((2000 / 4.1) / (1000 / 4.0) - 1))
    assert "per-step overhead is shared" in streams.answer
    assert "end-to-end output tok/s" in streams.answer  # the other measure is shown too


def test_bandwidth_bound_headline():
    a = attribute(5.0, {"weights": 4.0, "kv": 0.3}, basis="predict")
    v = build_verdict(VerdictInputs(attribution=a, measured_tok_s=200.0))
    assert v.headline.startswith("Memory-bandwidth-bound (weight reads)")
    assert v.bound_by == "memory-bandwidth-bound (weight reads)"


def test_no_measurement():
    v = build_verdict(VerdictInputs())
    assert "No decode measurement" in v.headline
    assert v.hypotheses == [] and v.changes == []


def test_client_hypothesis_from_server_metrics():
    a = attribute(5.0, {"weights": 0.1}, basis="cpu")

    def answer(srv, cli):
        v = build_verdict(
            VerdictInputs(attribution=a, measured_tok_s=200.0, server_itl_ms=srv, client_itl_ms=cli)
        )
        return next((h.answer for h in v.hypotheses if h.hypothesis.startswith("The client")), None)

    assert answer(5.31, 4.89).startswith("no: the engine's own inter-token latency")
    assert answer(4.0, 6.0).startswith("partly: the client sees 6 ms")
    assert answer(4.7, 1.5).startswith("the client's timing is unreliable here")
    assert answer(None, 4.9) is None


def test_measurement_far_below_prediction_is_not_called_bound_by_it():
    a = attribute(5.8, {"weights": 3.6, "launch": 6.2}, basis="predict")
    v = build_verdict(VerdictInputs(attribution=a, measured_tok_s=172.0))
    assert v.headline.startswith("Faster than predicted")
    assert "launch" in v.headline and v.bound_by == "prediction overestimates"


def test_a_level_whose_requests_failed_claims_no_gain():
    """llama-cpp-python's server drops concurrent streams (7 of 8 requests failed at 2): the
    one request that completed must not be read as '+82 % with two streams'."""
    a = attribute(1.0, {"weights": 0.1}, basis="cpu")
    lv = attribute_levels(
        [(1, 0.97, {"weights": 0.1}, 823.0), (2, 1.06, {"weights": 0.1}, 338.0)],
        [
            {"completed": 8, "failed": 0, "errors": {}},
            {"completed": 1, "failed": 7, "errors": {"connection": 7}},
        ],
    )
    v = build_verdict(
        VerdictInputs(attribution=a, measured_tok_s=1000.0, hardware_kind="cpu", levels=lv)
    )
    streams = next(h for h in v.hypotheses if "streams" in h.hypothesis)
    assert streams.answer.startswith("not served: at concurrency 2, 7 of 8 requests failed")
    assert "connection 7" in streams.answer and streams.predicted_gain_pct is None
    assert not any("streams at once" in c.change for c in v.changes)
