"""The evidence ladder is data (data/predict/evidence.yaml) and every op kind climbs it."""

from __future__ import annotations

import json

import pytest

from ceiling.errors import CeilingError
from ceiling.predict import ladder as ladder_mod
from ceiling.predict.api import PredictRequest, predict

PROFILE = {
    "schema_version": 1,
    "gpu": "h200",
    "ops": [
        {"family": "gemm_bf16", "t0_us": 5.0, "bw_GBps": 4000},
        {"family": "attn_gqa", "t0_us": 7.0, "bw_GBps": 3000},
    ],
}


def _sources(p, kinds=("gemm_bf16", "attn_gqa")):
    return {o.source for o in p.expected.ops if o.kernel in kinds}


def test_the_ladder_ranks_trace_over_profile_over_tables_over_priors():
    lad = ladder_mod.ladder()
    assert lad.ladder == ["trace", "profile", "table", "prior"]
    assert lad.confidence.trace > lad.confidence.profile.kernel > lad.confidence.table.gemm.exact
    assert lad.confidence.table.gemm.near > lad.confidence.prior.own_class


def test_a_measured_profile_wins_over_priors_with_the_ladders_confidence(tmp_path, priors_only):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(PROFILE))
    p = predict(PredictRequest(model="llama-3.1-8b", gpu="h200", profile=str(path)))
    ops = [o for o in p.expected.ops if o.kernel in ("gemm_bf16", "attn_gqa")]
    assert ops and {o.source for o in ops} == {"profile"}
    assert {o.confidence for o in ops} == {ladder_mod.ladder().confidence.profile.kernel}


def test_the_order_in_the_data_is_the_order_used(tmp_path, priors_only, monkeypatch):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(PROFILE))
    req = PredictRequest(model="llama-3.1-8b", gpu="h200", profile=str(path))
    moved = ladder_mod.ladder().model_copy(update={"ladder": ["trace", "prior", "profile"]})
    monkeypatch.setattr(ladder_mod, "ladder", lambda: moved)
    assert _sources(predict(req)) == {"prior"}  # the prior now answers first


def test_a_ladder_without_prior_is_refused():
    from ceiling.spec._data import validate_data

    data = ladder_mod.ladder().model_dump()
    data["ladder"] = ["trace", "profile", "table"]
    with pytest.raises(CeilingError, match="prior"):
        validate_data(data, ladder_mod.Ladder, "data/predict/evidence.yaml")


def test_the_ladder_file_cannot_rank_trace_below_another_source():
    """trace_evidence applies the trace over the whole step (above every source an op climbed
    to), so the data cannot say otherwise."""
    from pydantic import ValidationError

    raw = ladder_mod.ladder().model_dump()
    raw["ladder"] = ["profile", "trace", "table", "prior"]
    with pytest.raises(ValidationError, match="top rung"):
        ladder_mod.Ladder.model_validate(raw)
    raw["ladder"] = ["trace", "profile", "table", "prior"]
    assert ladder_mod.Ladder.model_validate(raw).ladder[0] == "trace"


COMM_PROFILE = {
    "schema_version": 1,
    "gpu": "h200",
    "kernel_launch_us_graph": 1.1,
    "ops": [{"family": "elementwise", "t0_us": 1.5}],
    "collectives": [
        {"world_size": 2, "alpha_us": 9.0, "beta_GBps": 100.0, "in_cuda_graph": True},
    ],
}


def test_allreduce_and_elementwise_ops_climb_the_same_ladder(tmp_path, priors_only, monkeypatch):
    """comm and elementwise ops take the data's order too (no chain of their own)."""
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(COMM_PROFILE))
    req = PredictRequest(
        model="llama-3.1-8b", gpu="h200", tp=2, link="nvlink4", allreduce="nccl", profile=str(path)
    )
    kinds = ("elementwise", "allreduce/nccl")
    conf = ladder_mod.ladder().confidence
    ops = [o for o in predict(req).expected.ops if o.kernel in kinds]
    assert {o.kernel for o in ops} == set(kinds)
    assert {(o.kernel, o.source, o.confidence) for o in ops} == {
        ("elementwise", "profile", conf.profile.elementwise),
        ("allreduce/nccl", "profile", conf.profile.collective),
    }
    moved = ladder_mod.ladder().model_copy(update={"ladder": ["trace", "prior", "profile"]})
    monkeypatch.setattr(ladder_mod, "ladder", lambda: moved)
    assert _sources(predict(req), kinds) == {"prior"}


def test_the_elementwise_and_collective_fractions_are_data(priors_only, monkeypatch):
    """elementwise_bw_fraction and bound_comm_other_fraction (constants.yaml), not literals."""
    from ceiling.predict import core

    req = PredictRequest(model="llama-3.1-8b", gpu="h200", tp=8, link="nvlink4", batch=64)

    def run():
        p = predict(req)
        assert p.bound is not None
        exp = {o.name: o for o in p.expected.ops}
        gathers = [(exp[o.name].ms, o.ms) for o in p.bound.ops if o.kernel == "gather/nccl"]
        elementwise = sum(o.ms for o in p.expected.ops if o.kernel == "elementwise")
        return gathers, elementwise

    gathers, elementwise = run()
    frac = core.constants().bound_comm_other_fraction
    assert gathers and all(b == pytest.approx(e * frac, abs=1e-4) for e, b in gathers)
    changed = core.constants().model_copy(
        update={"bound_comm_other_fraction": frac / 2, "elementwise_bw_fraction": 0.1}
    )
    monkeypatch.setattr(core, "constants", lambda: changed)
    gathers2, elementwise2 = run()
    assert all(b == pytest.approx(e * frac / 2, abs=1e-4) for e, b in gathers2)
    assert elementwise2 > elementwise
