"""``bench --ray``: workers as Ray actors on a local multi-node Ray cluster (two raylets, one
machine), clock offsets measured, records merged like local workers."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from ceiling.bench import rayworkers  # noqa: E402
from ceiling.bench.config import BenchConfig  # noqa: E402
from ceiling.bench.rayworkers import estimate_offset  # noqa: E402
from ceiling.bench.runner import run_bench  # noqa: E402
from sse_server import Plan, SSEServer  # noqa: E402


def test_offset_estimate_takes_the_fastest_round_trip() -> None:
    # Worker clock = driver clock + 5000 ns; the slow round trip's midpoint is misleading.
    samples = [(0, 5_000 + 900, 1_000), (2_000, 7_000 + 100, 2_200), (5_000, 10_000 + 4_000, 9_000)]
    off, unc = estimate_offset(samples)
    assert (off, unc) == (5_000, 100)


@pytest.mark.timeout(300)
def test_ray_workers_on_two_nodes_measure_clocks_and_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    # The actors run on this machine: pretend the driver is another host, so that offsets are
    # measured (and must come out ~0 within their uncertainty) instead of known to be 0.
    real = rayworkers.host_info
    monkeypatch.setattr(rayworkers, "host_info", lambda: {**real(), "boot_id": "another-host"})
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1)
    try:
        with SSEServer(Plan(ttft_s=0.02, itl_s=0.005)) as srv:
            cfg = BenchConfig(
                url=srv.url,
                mode="concurrency",
                concurrency=[4],
                requests=12,
                max_tokens=10,
                input_len=4,
                warmup=1,
                workers=2,
                ray=cluster.address,
            )
            res = run_bench(cfg, progress=False)
            assert srv.n_requests == 13
            # Offsets that cannot be pinned down: no cross-worker timing, said so.
            monkeypatch.setattr(rayworkers, "MAX_UNCERTAINTY_MS", -1.0)
            blind = run_bench(cfg, progress=False)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    assert res.completed == 12 and not res.partial and res.clock_aligned
    assert len(res.workers) == 2 and all(w.kind == "ray" for w in res.workers)
    assert len({w.node for w in res.workers}) == 2  # spread over both nodes
    for w in res.workers:
        assert w.clock_basis == "measured" and not w.same_host
        assert w.clock_uncertainty_ms is not None and w.clock_offset_ms is not None
        # One CLOCK_MONOTONIC in truth: the estimate must contain 0.
        assert abs(w.clock_offset_ms) <= w.clock_uncertainty_ms + 0.5
        assert w.loop_lag_ms["p99"] is not None and w.requests == 6
    assert res.steady_state_output_throughput is not None
    assert blind.completed == 12 and not blind.clock_aligned
    assert {w.clock_basis for w in blind.workers} == {"unknown"}
    assert blind.steady_state_output_throughput is None and blind.duration > 0
    assert any("clock offsets" in w for w in blind.warnings)
