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
