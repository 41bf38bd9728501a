"""Attribution math: components keep their predicted values, the remainder is named."""

from __future__ import annotations

import pytest

from ceiling.diagnose.attribute import (
    UNEXPLAINED_LABEL,
    attribute,
    attribute_levels,
    step_ci_ms,
    step_ms,
)
from ceiling.predict.api import PredictRequest, load_spec, predict
from ceiling.predict.cpu import floors_ms, kv_bytes_per_token, weight_bytes_per_step
from ceiling.spec.hardware import CpuHardware


def test_remainder_is_measured_minus_predicted_and_named():
    a = attribute(12.0, {"weights": 6.0, "collectives": 3.0, "launch": 1.0}, basis="test")
    assert a.predicted_step_ms == pytest.approx(10.0)
    assert a.unexplained_ms == pytest.approx(2.0)
    assert a.unexplained_pct == pytest.approx(100 * 2 / 12)
    assert a.unexplained_label == UNEXPLAINED_LABEL
    assert a.fundamental_ms == pytest.approx(9.0)  # weights + collectives
    assert a.configurable_ms == pytest.approx(1.0)  # launch
    shares = {c.name: c.share_pct for c in a.components}
    assert shares["weights"] == pytest.approx(50.0)
    assert a.bound_by == "weights"
    # every millisecond is accounted for exactly once
    total = sum(c.predicted_ms for c in a.components) + a.unexplained_ms
    assert total == pytest.approx(a.measured_step_ms)


def test_host_bound_when_remainder_dominates():
    a = attribute(4.0, {"weights": 0.1, "kv": 0.01}, basis="cpu")
    assert a.bound_by == UNEXPLAINED_LABEL
    assert a.unexplained_pct > 97
    assert a.explained_pct == pytest.approx(100 * 0.11 / 4.0)


def test_measured_faster_than_predicted_is_reported_not_hidden():
    a = attribute(5.0, {"weights": 6.0}, basis="test")
    assert a.unexplained_ms == pytest.approx(-1.0)
    assert "overestimates" in (a.unexplained_note or "")
    assert a.explained_pct == pytest.approx(100.0)


def test_kind_overrides_and_unknown_components():
    a = attribute(
        10.0, {"weights": 5.0, "mystery": 1.0}, basis="t", kinds={"weights": "configurable"}
    )
    kinds = {c.name: c.kind for c in a.components}
    assert kinds == {"weights": "configurable", "mystery": "configurable"}


def test_step_conversions():
    assert step_ms(250.0) == pytest.approx(4.0)
    lo, hi = step_ci_ms(200.0, 250.0)
    assert (lo, hi) == (pytest.approx(4.0), pytest.approx(5.0))
    assert step_ci_ms(None, 3.0) is None
    with pytest.raises(ValueError):
        step_ms(0.0)


def test_levels_show_per_step_overhead_shared_by_the_batch():
    lv = attribute_levels([(1, 4.0, {"weights": 0.1}, 250.0), (2, 4.2, {"weights": 0.1}, 470.0)])
    assert lv[0].unexplained_per_token_ms == pytest.approx(3.9)
    assert lv[1].unexplained_per_token_ms == pytest.approx(2.05)
    assert lv[1].predicted_per_token_ms == pytest.approx(0.05)


def test_levels_use_the_batch_the_engine_ran():
    """Two streams the engine ran one at a time (its counters: 1.0 sequences per step) make one
    token per step: the level must not claim twice the single stream's rate."""
    rows = [(1, 4.0, {"weights": 0.1}, 250.0), (2, 4.0, {"weights": 0.1}, 250.0)]
    alone = attribute_levels(rows, [{}, {"engine_batch": 1.0}])
    assert alone[1].engine_batch == 1.0 and alone[1].concurrency == 2
    assert alone[1].decode_tok_s_total == pytest.approx(250.0)  # not 500
    assert alone[1].unexplained_per_token_ms == pytest.approx(3.9)
    # partly together: 1.5 per step; at or above the concurrency the streams are the batch
    part = attribute_levels(rows, [{}, {"engine_batch": 1.5}])
    assert part[1].decode_tok_s_total == pytest.approx(375.0)
    full = attribute_levels(rows, [{}, {"engine_batch": 2.0}])
    assert full[1].decode_tok_s_total == pytest.approx(500.0)
    assert attribute_levels(rows)[1].decode_tok_s_total == pytest.approx(500.0)  # no counters


def test_cpu_floors_scale_with_bytes_and_batch():
    """predict's CPU backend: weights read once per step, KV and compute per sequence."""
    spec = load_spec("llama-3.1-8b")
    host = CpuHardware(name="c", cores=2, mem_bw_GBps=10.0, gflops=20.0, measured=True, source="t")
    c1 = floors_ms(spec, host, batch=1, context=100)
    assert c1["weights"] == pytest.approx(weight_bytes_per_step(spec, 1) / 10e9 * 1e3)
    assert c1["weights"] == pytest.approx(spec.weight_bytes() / 10e9 * 1e3, rel=0.1)
    assert c1["kv"] == pytest.approx(100 * kv_bytes_per_token(spec) / 10e9 * 1e3)
    assert c1["compute"] == pytest.approx(2 * spec.active_params() / 20e9 * 1e3)
    c4 = floors_ms(spec, host, batch=4, context=100)
    assert c4["weights"] == pytest.approx(c1["weights"], rel=1e-3)  # read once per step
    assert c4["kv"] == pytest.approx(4 * c1["kv"])
    assert c4["compute"] == pytest.approx(4 * c1["compute"])
    # the same floors through predict(): a CPU is a predict backend, floors only
    p = predict(PredictRequest(model="llama-3.1-8b", hardware=host, batch=4, context=100))
    assert p.kind == "cpu-floors" and p.expected is None and p.bound is not None
    assert p.components_ms == pytest.approx(c4, rel=1e-4)
    assert p.hardware.kind == "cpu" and p.hardware.bw_GBps_achieved == 10.0


def test_last_level_cache_from_sysfs(tmp_path):
    from ceiling.probe.cpu_host import last_level_cache_bytes

    base = tmp_path / "devices/system/cpu/cpu0/cache"
    for idx, size in (("index0", "32K"), ("index2", "512K"), ("index3", "32768K")):
        (base / idx).mkdir(parents=True)
        (base / idx / "size").write_text(size + "\n")
    assert last_level_cache_bytes(str(tmp_path)) == 32 * 1024 * 1024
    assert last_level_cache_bytes(str(tmp_path / "nowhere")) is None
