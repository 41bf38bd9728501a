"""The Ray executor on a local Ray cluster (CPU only): trials run as Ray tasks, the ledger on
the driver records every streamed repeat."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from ray import cloudpickle  # noqa: E402  (vendored by ray)

import sweep_helpers  # noqa: E402
from ceiling.flows.sweep import RayExecutor  # noqa: E402
from ceiling.flows.sweep import run as run_sweep  # noqa: E402
from ceiling.sweep.ledger import Ledger  # noqa: E402
from sweep_helpers import synthetic_trial, write_plan  # noqa: E402


@pytest.mark.timeout(300)
def test_ray_executor_runs_trials_and_driver_keeps_ledger(tmp_path):
    cloudpickle.register_pickle_by_value(sweep_helpers)  # workers do not have tests/ on the path
    plan = write_plan(tmp_path, ["base", "same", "fast"], repeats=4)
    events: list[tuple[str, str]] = []
    ex = RayExecutor(address=None, gpus_per_trial=0, cpus_per_trial=1)
    try:
        res = run_sweep(
            plan,
            tmp_path / "out",
            executor=ex,
            trial_fn=synthetic_trial,
            preflight_fn=None,
            on_event=lambda n, e: events.append((n, e.type_)),
        )
    finally:
        cloudpickle.unregister_pickle_by_value(sweep_helpers)
    assert not ray.is_initialized()  # the executor shut its local cluster down
    by = {v.name: v for v in res.variants}
    assert by["base"].repeats == 4 and by["fast"].verdict == "faster than baseline"
    assert by["same"].status == "stopped_early"
    assert ("base", "launched") in events and ("fast", "done") in events
    with Ledger(tmp_path / "out" / "ledger.sqlite") as led:
        total = sum(led.repeat_count(v.fingerprint) for v in led.variants())
    assert total == 4 + 3 + 4
