"""calibrate: refuses without a GPU (with the --cpu way out), measures the CPU when asked,
labels such a profile as CPU, and profiles round-trip into predict."""

from __future__ import annotations

from pathlib import Path

import pytest

from ceiling.errors import CeilingError
from ceiling.spec.profile import HardwareProfile, load_profile, save_profile

torch = pytest.importorskip("torch")

from ceiling.probe.calibrate import CalibrateConfig, run_calibrate, to_profile  # noqa: E402

# a copy of experiments/results/2026-11-29_h200-1gpu_session1/profile.json (see its README)
H200_PROFILE = Path(__file__).parent / "fixtures" / "h200_profile" / "profile.json"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_no_gpu_is_a_clear_error_naming_the_cpu_option():
    with pytest.raises(CeilingError) as err:
        run_calibrate(CalibrateConfig())
    assert "no CUDA GPU" in err.value.message and "--cpu" in err.value.fix


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cli_calibrate_without_gpu_exits_nonzero(capsys):
    from ceiling.cli import main

    assert main(["calibrate"]) != 0
    assert "--cpu" in capsys.readouterr().err


@pytest.fixture(scope="module")
def cpu_result():
    return run_calibrate(CalibrateConfig(device="cpu", scale=0.05, reps=2, batches=[1, 4]))


def test_cpu_measurement_is_measured_and_labelled(cpu_result):
    r = cpu_result
    assert r.device == "cpu" and r.device_name.startswith("CPU")
    assert r.mem_read_GBps > 0 and r.copy_GBps > 0
    assert r.launch_us_eager > 0 and r.launch_us_graph is None
    assert {(p.dtype, p.batch) for p in r.gemv} == {("bf16", 1), ("bf16", 4)}
    assert all(p.bw_GBps > 0 and p.weight_bytes > 0 for p in r.gemv)
    assert any("CPU measurement" in n for n in r.notes)
    prof = to_profile(r)
    assert prof.device == "cpu" and prof.gpu is None
    assert "CPU measurement" in prof.machine
    assert prof.gemv_bw_GBps["bf16"] == r.gemv_bw()["bf16"]


def test_unavailable_dtype_is_skipped_with_its_reason():
    r = run_calibrate(
        CalibrateConfig(device="cpu", scale=0.02, reps=1, batches=[1], dtypes=["bf16", "fp4x"])
    )
    assert "fp4x" in r.skipped and "unknown dtype" in r.skipped["fp4x"]
    assert "gemv fp4x not measured" in " ".join(to_profile(r).notes)


def test_profile_round_trip_and_merge(cpu_result, tmp_path):
    prof = to_profile(cpu_result)
    path = save_profile(prof, tmp_path / "cal.json")
    assert load_profile(path) == prof
    merged = prof.merge(HardwareProfile(kernel_launch_us_graph=1.5, notes=["commbench"]))
    assert merged.kernel_launch_us_graph == 1.5
    assert merged.mem_bw_GBps == prof.mem_bw_GBps
    assert "commbench" in merged.notes


def test_recorded_h200_profile_drives_predict():
    """The profile calibrate wrote on the H200 (experiments/results) changes predict's numbers."""
    from ceiling.predict.api import PredictRequest, predict

    path = H200_PROFILE
    prof = load_profile(path)
    assert prof.gpu == "h200" and prof.device == "cuda"
    base = predict(PredictRequest(model="llama-3.1-8b", gpu="h200")).model_dump()
    with_prof = predict(
        PredictRequest(model="llama-3.1-8b", gpu="h200", profile=str(path))
    ).model_dump()
    assert with_prof["decode_ms_per_token"] != base["decode_ms_per_token"]
    weights_gb = with_prof["components_ms"]["weights"] * max(prof.gemv_bw_GBps.values()) / 1e3
    assert 14 < weights_gb < 17  # ~15 GB of Llama-8B weights read at the measured bandwidth
    assert any("profile" in a for a in with_prof["assumptions"])


def test_gemv_line_fit_recovers_fixed_cost_and_bandwidth():
    from ceiling.probe.calibrate import fit_line

    # 6 us fixed + bytes / 4000 GB/s, exactly
    pts = [(b, 6.0 + b / 4000e3) for b in (2e6, 6e6, 22e6, 50e6, 235e6)]
    fixed, bw = fit_line(pts)
    assert fixed == pytest.approx(6.0, abs=1e-3) and bw == pytest.approx(4000, rel=1e-3)
    with pytest.raises(ValueError):
        fit_line([(1e6, 10.0), (2e6, 9.0)])  # time falling with bytes: broken measurement


def test_fit_goes_into_the_profile_as_predicts_two_numbers(cpu_result):
    """The aggregate GEMV figure folds fixed costs in; predict adds them per kernel, so the
    profile must carry the fitted slope and intercept instead."""
    from ceiling.probe.calibrate import GemvFit, to_profile

    res = cpu_result.model_copy(deep=True)
    res.gemv_fit = GemvFit(dtype="bf16", batch=1, fixed_us=6.1, bw_GBps=4286.0, points=[])
    prof = to_profile(res)
    assert prof.gemm_fixed_us_graph == 6.1
    assert prof.gemv_bw_GBps["bf16"] == 4286.0
    assert any("6.1 us fixed" in n for n in prof.notes)


def test_ops_microbenchmarks_on_cpu_feed_predict(tmp_path):
    """calibrate --ops: per-family fits at a model's decode shapes become profile ops that
    predict uses per op (source 'profile'); stand-in kernels (PyTorch grouped GEMM for fused
    MoE) are recorded but do not replace an engine's kernel."""
    from ceiling.predict.api import PredictRequest, predict
    from ceiling.probe.calibrate_ops import OpsConfig, run_ops, to_profile_ops

    res = run_ops(
        OpsConfig(device="cpu", models=["qwen3-30b-a3b"], tp=4, batches=[1], contexts=[1024],
                  budget_MiB=16, reps=1)
    )  # fmt: skip
    fams = {f.family: f for f in res.fits}
    assert {"gemm_bf16", "attn_gqa", "elementwise", "moe_bf16"} <= set(fams)
    assert fams["gemm_bf16"].engine_kernel and not fams["moe_bf16"].engine_kernel
    assert all(p.us > 0 and p.nbytes > 0 for p in res.points)
    assert "gemm_fp8" in res.skipped
    prof = to_profile_ops(res)
    assert prof.device == "cpu" and prof.ops
    path = save_profile(prof, tmp_path / "ops.json")
    p = predict(PredictRequest(model="qwen3-30b-a3b", gpu="h200", tp=4, profile=str(path)))
    src = {o.name: o.source for o in p.expected.ops}
    assert src["attn.o_proj"] == "profile" and src["attention.decode"] == "profile"
    assert src["moe.experts"] != "profile"
