"""``bench --workers N``: how a level is cut into shares, how shares merge, and whole runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ceiling.bench.config import BenchConfig
from ceiling.bench.load import PromptPool, RequestOptions
from ceiling.bench.metrics import RequestRecord, summarize
from ceiling.bench.runner import run_bench
from ceiling.bench.workers import ShareOutput, merge, plan_shares, split_proportional
from ceiling.bench.workloads import Prompt, arrival_offsets
from sse_server import Plan, SSEServer

pytestmark = pytest.mark.timeout(180)
OPTS = RequestOptions(model="m", path="/v1/completions", max_tokens=8)


def _pool(n: int, reusable: bool = False) -> PromptPool:
    return PromptPool([Prompt(text=f"p{i}") for i in range(n)], reusable=reusable)


def test_closed_loop_level_splits_streams_evenly_and_requests_exactly() -> None:
    cfg = BenchConfig(url="x", mode="concurrency", concurrency=[7], requests=23)
    pool = _pool(100)
    shares = plan_shares(cfg, 7, 0, pool, OPTS, 3, start_ns=123)
    assert [s.streams for s in shares] == [3, 2, 2]
    assert sum(s.count or 0 for s in shares) == 23
    indices = [s.first_index + k * s.index_step for s in shares for k in range(s.count or 0)]
    assert sorted(indices) == list(range(23))  # every request once
    # Prompts are handed out in order, each once, as the single-process run would.
    assert [p.text for s in shares for p in s.prompts] == [f"p{i}" for i in range(23)]
    assert all(s.start_ns == 123 for s in shares)
    assert (
        split_proportional(10, [3, 2, 2]) == [5, 3, 2]
        or sum(split_proportional(10, [3, 2, 2])) == 10
    )


def test_open_loop_arrivals_merge_to_the_single_process_schedule() -> None:
    cfg = BenchConfig(url="x", mode="rate", rate=50, burstiness=0.5, requests=41, seed=7)
    shares = plan_shares(cfg, None, 2, _pool(100), OPTS, 4)
    merged = sorted(
        (s.first_index + k * s.index_step, off)
        for s in shares
        for k, off in enumerate(s.offsets or [])
    )
    expected = arrival_offsets(41, 50, 0.5, np.random.default_rng(7 + 2000)).tolist()
    assert [i for i, _ in merged] == list(range(41))
    assert [off for _, off in merged] == expected


def test_open_ended_shares_cycle_windows_and_report_use() -> None:
    cfg = BenchConfig(url="x", mode="concurrency", concurrency=[4], duration=1.0)
    pool = _pool(10)
    shares = plan_shares(cfg, 4, 0, pool, OPTS, 2)
    assert [s.count for s in shares] == [None, None]
    assert [p.text for p in shares[0].prompts] == ["p0", "p2", "p4", "p6", "p8"]
    assert [p.text for p in shares[1].prompts] == ["p1", "p3", "p5", "p7", "p9"]
    assert not pool.reused
    pool.advance(11)
    assert pool.reused


def _rec(t_send_s: float, tpot: float) -> RequestRecord:
    return RequestRecord(index=0, t_send_s=t_send_s, ok=True, tpot_ms=tpot, output_tokens=2)


def test_merge_moves_send_times_to_the_driver_clock_and_pools_samples() -> None:
    a = ShareOutput(worker=0, records=[_rec(10.0, 1.0)], start_ns=int(9.9e9), end_ns=int(12e9))
    b = ShareOutput(
        worker=1, records=[_rec(1010.0, 3.0)], start_ns=int(1009.8e9), end_ns=int(1013e9)
    )
    m = merge([a, b], {0: 0, 1: int(1000e9)}, wall_s=99.0)
    assert m.aligned and [r.t_send_s for r in m.records] == [10.0, 10.0]
    assert m.duration_s == pytest.approx(13.0 - 9.8)
    assert summarize(m.records, m.duration_s)["median_tpot_ms"] == 2.0  # from pooled samples
    lost = merge([a, b], {0: 0, 1: None}, wall_s=99.0)
    assert not lost.aligned and lost.duration_s == 99.0


def test_two_worker_run_merges_every_request_and_checks_each_loop(tmp_path: Path) -> None:
    with SSEServer(Plan(ttft_s=0.02, itl_s=0.005)) as srv:
        cfg = BenchConfig(
            url=srv.url,
            mode="concurrency",
            concurrency=[6],
            requests=18,
            max_tokens=12,
            input_len=4,
            warmup=1,
            workers=2,
            save_detailed=True,
            out=tmp_path / "w.json",
        )
        res = run_bench(cfg, progress=False)
        assert srv.n_requests == 19
    assert res.completed == 18 and not res.partial and res.clock_aligned
    assert len(res.workers) == 2 and {w.streams for w in res.workers} == {3}
    assert sum(w.requests for w in res.workers) == 18
    assert len({w.pid for w in res.workers}) == 2
    assert all(
        w.loop_lag_ms["p99"] is not None and w.clock_basis == "same_host" for w in res.workers
    )
    # Percentiles come from the merged per-request samples, not from per-worker summaries.
    assert res.requests is not None
    again = summarize(res.requests, res.duration, 6)
    for key in ("p99_itl_ms", "median_tpot_ms", "p90_ttft_ms", "mean_e2el_ms"):
        assert getattr(res, key) == pytest.approx(again[key])
    assert sorted(r.index for r in res.requests) == list(range(18))
    assert res.steady_state_output_throughput is not None
    saved = json.loads((tmp_path / "w.json").read_text())
    assert len(saved["workers"]) == 2 and saved["config"]["workers"] == 2


def test_dead_server_with_workers_keeps_what_was_measured(tmp_path: Path) -> None:
    with SSEServer(lambda i, _b: Plan(die=i == 6, itl_s=0.001)) as srv:
        cfg = BenchConfig(
            url=srv.url,
            mode="concurrency",
            concurrency=[2],
            requests=60,
            max_tokens=8,
            input_len=4,
            warmup=0,
            workers=2,
            out=tmp_path / "d.json",
        )
        res = run_bench(cfg, progress=False)
    assert res.partial and "stopped answering" in (res.partial_reason or "")
    assert 1 <= res.completed < 60
    assert json.loads((tmp_path / "d.json").read_text())["partial"] is True


def test_ctrl_c_with_workers_writes_a_partial_result(tmp_path: Path) -> None:
    out = tmp_path / "int.json"
    with SSEServer(Plan(itl_s=0.002)) as srv:
        cmd = [sys.executable, "-m", "ceiling", "bench", "--url", srv.url]
        cmd += ["--mode", "concurrency", "--concurrency", "4", "--requests", "1500"]
        cmd += ["--max-tokens", "40", "--warmup", "0", "--workers", "2", "--quiet"]
        cmd += ["--out", str(out)]
        # Its own process group, like a terminal's job: Ctrl-C reaches the workers too.
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        deadline = time.monotonic() + 60
        while srv.n_requests < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "partial result written" in err and "Traceback" not in err
    data = json.loads(out.read_text())
    assert data["partial"] is True and data["completed"] >= 4
    assert len(data["workers"]) == 2 and data["cancelled_in_flight"] >= 1


def _spawned_children() -> list[int]:
    """PIDs of this process's multiprocessing children (the bench workers we started)."""
    me, out = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me and b"spawn_main" in cmd:  # not the resource tracker
            out.append(int(entry.name))
    return out


def test_a_worker_that_dies_ends_the_run_with_what_the_others_measured(tmp_path: Path) -> None:
    import threading

    with SSEServer(Plan(itl_s=0.002)) as srv:

        def kill_one() -> None:
            deadline = time.monotonic() + 60
            while srv.n_requests < 10 and time.monotonic() < deadline:
                time.sleep(0.02)
            victims = _spawned_children()
            if victims:
                os.kill(victims[0], signal.SIGKILL)

        killer = threading.Thread(target=kill_one, daemon=True)
        killer.start()
        cfg = BenchConfig(
            url=srv.url,
            mode="concurrency",
            concurrency=[4],
            requests=2000,
            max_tokens=30,
            input_len=4,
            warmup=0,
            workers=2,
            out=tmp_path / "dead.json",
        )
        res = run_bench(cfg, progress=False)
        killer.join(5)
    assert (
        res.partial
        and "bench worker" in (res.partial_reason or "")
        and "died" in (res.partial_reason or "")
    )
    assert 1 <= res.completed < 2000  # the survivor's requests are kept
    assert json.loads((tmp_path / "dead.json").read_text())["partial"] is True
