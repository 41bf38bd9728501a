"""commbench: a real gloo allreduce with 2 ranks on the CPU, fits, per-token cost, profile
round-trip, the always-on safety environment, and the failure paths."""

from __future__ import annotations

import math
import os
import stat
import sys

import pytest

from ceiling.errors import CeilingError
from ceiling.probe import commbench
from ceiling.probe.commbench import CommbenchConfig, resolve_variants, run_commbench, to_profile
from ceiling.probe.fit import (
    algbw_GBps,
    busbw_GBps,
    fit_alpha_beta,
    human_size,
    interp_latency,
    parse_sizes,
)
from ceiling.spec.profile import load_profile, save_profile

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def gloo_result():
    cfg = CommbenchConfig(
        sizes=[1024, 65536],
        variants=["default"],
        custom_env=["GLOO_TEST_MARKER=1"],
        model="llama-3.1-8b",
        reps=2,
        warmup=1,
        min_iters=2,
        max_iters=10,
        budget_s=0.005,
        timeout_s=120,
    )
    seen = []
    res = run_commbench(cfg, lambda label, done, total: seen.append((label, done, total)))
    return res, seen


def test_gloo_two_ranks_measure_and_check(gloo_result):
    res, seen = gloo_result
    assert res.backend == "gloo" and res.device == "cpu"
    assert [r.variant for r in res.runs] == ["default", "GLOO_TEST_MARKER=1"]
    for run in res.runs:
        assert run.error is None, run.error
        assert run.world_size == 2
        sizes = [r.size_bytes for r in run.rows]
        # the requested sizes plus the model's decode message (4096 x 2 bytes) and the
        # reference decode sizes that fall inside the range
        assert 1024 in sizes and 65536 in sizes and 8192 in sizes
        assert sizes == sorted(sizes)
        assert all(r.correct for r in run.rows)
        assert all(r.time_us > 0 and r.graph_time_us is None for r in run.rows)
        row = run.rows[0]
        assert row.busbw_GBps == pytest.approx(row.algbw_GBps)  # 2(n-1)/n = 1 at n=2
        (fit,) = run.fits  # eager only on CPU
        assert fit.implementation == "gloo" and fit.world_size == 2 and not fit.in_cuda_graph
        assert fit.alpha_us >= 0 and fit.beta_GBps > 0
    assert seen and seen[-1][1] == seen[-1][2]  # progress reached the end


def test_every_rank_ran_with_the_safety_env_and_its_variant(gloo_result):
    res, _ = gloo_result
    for run in res.runs:
        assert run.env_seen["NCCL_NVLS_ENABLE"] == "0"
        assert run.env_seen["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
        assert run.env_seen["NVSHMEM_DISABLE_NVLS"] == "1"
    assert "GLOO_TEST_MARKER" not in res.runs[0].env_seen  # fresh processes per variant
    assert res.runs[1].env_seen["GLOO_TEST_MARKER"] == "1"


def test_marks_and_per_token_cost(gloo_result):
    res, _ = gloo_result
    row = next(r for r in res.runs[0].rows if r.size_bytes == 8192)
    assert any("llama-3.1-8b" in m for m in row.marks)
    mc = res.model_cost
    assert mc is not None and mc.hidden == 4096 and mc.layers == 32
    assert mc.allreduces_per_token == 64
    default = next(r for r in mc.rows if r.variant == "default")
    assert default.message_bytes == 8192
    assert default.per_token_ms == pytest.approx(64 * row.time_us / 1e3, rel=1e-3)
    assert default.delta_vs_default_pct == 0
    other = next(r for r in mc.rows if r.variant != "default")
    assert other.delta_vs_default_pct is not None


def test_profile_round_trip(gloo_result, tmp_path):
    res, _ = gloo_result
    prof = to_profile(res)
    assert len(prof.collectives) == 2
    path = save_profile(prof, tmp_path / "p.json")
    assert load_profile(path) == prof


def test_world_size_one_stays_out_of_the_profile(gloo_result):
    res, _ = gloo_result
    one = res.model_copy(deep=True)
    for run in one.runs:
        run.world_size = 1
    prof = to_profile(one)
    assert prof.collectives == []
    assert any("world size 1" in n for n in prof.notes)


def test_fit_recovers_alpha_and_beta():
    pts = [(s, 10 + s / (50 * 1e3)) for s in (1024 * 2**i for i in range(17))]
    alpha, beta = fit_alpha_beta(pts)
    assert alpha == pytest.approx(10, rel=1e-6) and beta == pytest.approx(50, rel=1e-6)
    flat = [(1024, 20.0), (2048, 20.0), (4096, 19.0)]
    a, b = fit_alpha_beta(flat)
    assert b == math.inf and 19 <= a <= 20


def test_bandwidth_arithmetic_is_nccl_tests():
    assert algbw_GBps(1_000_000, 10) == pytest.approx(100)
    assert busbw_GBps(1_000_000, 10, 8) == pytest.approx(100 * 2 * 7 / 8)
    assert busbw_GBps(1_000_000, 10, 1) == 0


def test_sizes_and_interpolation():
    assert parse_sizes("1K..8K") == [1024, 2048, 4096, 8192]
    assert parse_sizes("14K,1K,1M") == [1024, 14336, 1048576]
    assert len(parse_sizes("1K..64M")) == 17
    assert human_size(14336) == "14K" and human_size(64 * 2**20) == "64M"
    pts = [(1000, 10.0), (4000, 40.0)]
    assert interp_latency(pts, 2000) == pytest.approx(20.0)
    assert interp_latency(pts, 10) == 10.0


def test_variant_presets_and_custom_env():
    v = dict(resolve_variants(["issue7"], []))
    assert v["ring"] == {"NCCL_ALGO": "Ring"}
    assert v["p2p-off"] == {"NCCL_P2P_DISABLE": "1"}
    assert v["channels16-buff16m"] == {"NCCL_MAX_NCHANNELS": "16", "NCCL_BUFFSIZE": "16777216"}
    assert resolve_variants([], []) == [("default", {})]
    assert resolve_variants([], ["NCCL_PROTO=LL"]) == [("NCCL_PROTO=LL", {"NCCL_PROTO": "LL"})]
    with pytest.raises(CeilingError, match="unknown commbench variant"):
        resolve_variants(["warp-speed"], [])
    with pytest.raises(CeilingError, match="KEY=VALUE"):
        resolve_variants([], ["NCCL_PROTO"])


def _fake_python(tmp_path, body: str) -> str:
    p = tmp_path / "python"
    p.write_text(f"#!/bin/sh\n{body}\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_missing_torch_is_an_error_with_the_install_fix(tmp_path):
    # -S: no site-packages, so no torch: what a machine without the extra looks like
    py = _fake_python(tmp_path, f'exec {sys.executable} -S "$@"')
    with pytest.raises(CeilingError) as err:
        run_commbench(CommbenchConfig(sizes=[1024], python=py))
    assert "PyTorch" in err.value.message and "ceiling[torch]" in err.value.fix


def test_failing_ranks_become_a_run_error_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setattr(commbench, "_torch_facts", lambda python: (False, 0))
    py = _fake_python(tmp_path, 'echo "rank blew up: $RANK" >&2; exit 3')
    res = run_commbench(CommbenchConfig(sizes=[1024], python=py, timeout_s=30))
    (run,) = res.runs
    assert run.rows == [] and run.fits == []
    assert "exit codes [3, 3]" in run.error and "rank blew up" in run.error


def test_nccl_on_a_machine_without_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(commbench, "_torch_facts", lambda python: (False, 0))
    with pytest.raises(CeilingError, match="NCCL needs CUDA"):
        run_commbench(CommbenchConfig(backend="nccl"))


def test_cli_commbench_gloo_writes_profile_and_results(tmp_path):
    from ceiling.cli import main

    prof, results = tmp_path / "prof.json", tmp_path / "res.json"
    rc = main(
        [
            "commbench",
            "--sizes",
            "1K",
            "--reps",
            "2",
            "--budget-ms",
            "2",
            "--out",
            str(prof),
            "--results",
            str(results),
        ]
    )
    assert rc == 0
    assert load_profile(prof).collectives[0].implementation == "gloo"
    assert '"schema_version": 1' in results.read_text()
    assert os.path.getsize(results) > 0
