"""llama.cpp's decode kernels timed inside its CUDA graph on the H200 (Nsight Compute, call 5 of
experiments/results/2026-12-02_h200-llamacpp), kept without a GPU: what the recorded run shows.

- every decode evaluation of a run launches the same kernels (the cut into tokens is exact);
- under ncu each kernel runs alone (no overlap, the GPU idle between kernels while ncu works),
  so the kernels' sum is above the step llama-bench measures: an upper bound per kernel;
- even so, the quantized mat-vecs cost less inside the graph than test-backend-ops timed them
  one by one (call 3): that isolated timing at small shapes is what made the refit overstate
  every quantized file; the F16 mat-vecs, bandwidth-bound, cost about the same both ways.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
CALL = ROOT / "experiments/results/2026-12-02_h200-llamacpp/call5"
FILES = ("llama3.1-8b-q4_k_m", "llama3.1-8b-q6_k", "llama3.1-8b-f16", "qwen3-30b-a3b-q4_k_m")


@pytest.fixture(scope="module")
def kernels():
    return load_script(ROOT / "experiments/validation/llamacpp_kernels.py")


@pytest.fixture(scope="module")
def recorded() -> dict[str, dict]:
    return {r["file"]: r for r in json.loads((CALL / "kernels.json").read_text())["rows"]}


def test_the_recorded_analysis_recomputes_from_the_kernel_timings(kernels, recorded, tmp_path):
    for name in ("llama3.1-8b-q4_k_m", "llama3.1-8b-f16"):
        got = kernels.analyse(CALL, name, tmp_path)
        want = recorded[name]
        assert got["kernels_per_token"] == want["kernels_per_token"]
        assert got["kernels_us"] == pytest.approx(want["kernels_us"], rel=1e-9)
        assert got["by_kind_us"] == pytest.approx(want["by_kind_us"], rel=1e-9)


def test_every_evaluation_launches_the_same_kernels(kernels, recorded) -> None:
    assert set(recorded) == set(FILES)
    for name, r in recorded.items():
        spread = r["token_spread_us"]
        assert len(spread) == r["tokens_in_run"] == 4
        assert max(spread) / min(spread) < 1.02, name
    with pytest.raises(ValueError):  # a run that does not divide is not cut
        kernels.tokens([("a", 1.0)] * 7, 4)
    with pytest.raises(ValueError):
        kernels.tokens([("a", 1.0), ("b", 1.0), ("b", 1.0), ("b", 1.0)], 2)


def test_kernel_names_are_classified_by_weight_type(kernels) -> None:
    assert kernels.kind("void mul_mat_vec_q<12, 1, 1, 0, 0>(const void *)") == "matvec Q4_K"
    assert kernels.kind("void mul_mat_vec_q<(ggml_type)14, 1, 0>(const void *)") == "matvec Q6_K"
    assert kernels.kind("void mul_mat_vec_f<__half, float, 1, 256, 0, 0>(...)") == "matvec F16"
    assert kernels.kind("void flash_attn_ext_vec<128, 1, 1, 1, 0>(...)") == "attention"
    assert kernels.kind("quantize_q8_1(const float *)") == "quantize activations"


def test_under_ncu_the_kernels_add_up_to_more_than_the_step(recorded) -> None:
    for name, r in recorded.items():
        assert r["kernels_us"] > r["step_us"], name


def test_quantized_mat_vecs_cost_less_in_the_graph_than_alone(recorded) -> None:
    q = recorded["llama3.1-8b-q4_k_m"]["in_graph_vs_isolated"]
    assert q["Q4_K"] < 0.75 and q["Q6_K"] < 0.9
    assert recorded["llama3.1-8b-q6_k"]["in_graph_vs_isolated"]["Q6_K"] < 0.9
    assert recorded["llama3.1-8b-f16"]["in_graph_vs_isolated"]["F16"] == pytest.approx(
        1.0, abs=0.06
    )


# ---- call 6: the same kernels recorded by CUPTI (kernel_times.cpp), not serialised ----------

CALL6 = ROOT / "experiments/results/2026-12-02_h200-llamacpp/call6"


@pytest.fixture(scope="module")
def traced() -> dict[str, dict]:
    return {r["file"]: r for r in json.loads((CALL6 / "kernels.json").read_text())["rows"]}


def test_the_trace_recomputes_and_lost_nothing(kernels, traced, tmp_path) -> None:
    got = kernels.analyse(CALL6, "llama3.1-8b-q4_k_m", tmp_path, "cupti")
    want = traced["llama3.1-8b-q4_k_m"]
    assert got["kernels_per_token"] == want["kernels_per_token"] == 614
    assert got["tokens_in_run"] == 33  # llama-bench's warm-up token and -n 32
    assert got["gpu_step_us"] == pytest.approx(want["gpu_step_us"], rel=1e-9)
    assert got["by_kind_us"] == pytest.approx(want["by_kind_us"], rel=1e-9)
    for f in CALL6.glob("cupti-*.tsv.gz"):
        assert kernels.read_cupti(f)  # raises when CUPTI says it dropped records


def test_a_trace_that_dropped_records_is_refused(kernels, tmp_path) -> None:
    import gzip

    f = tmp_path / "cupti-x.tsv.gz"
    f.write_bytes(gzip.compress(b"1\t2\t0\t14\tk()\n# dropped 3\n"))
    with pytest.raises(ValueError, match="dropped"):
        kernels.read_cupti(f)


def test_the_trace_has_its_own_cost(traced) -> None:
    """The traced run's step is longer than the untraced one by 1-3 us per kernel: CUPTI's
    timestamps are not free, so its per-kernel figures also bound the kernels from above."""
    for name, r in traced.items():
        per_kernel = (r["traced_step_us"] - r["step_us"]) / r["kernels_per_token"]
        assert 0.5 < per_kernel < 3.0, name


def test_traced_small_quantized_mat_vecs_also_cost_less_than_alone(traced) -> None:
    for name, typ in (("llama3.1-8b-q4_k_m", "Q4_K"), ("llama3.1-8b-iq4_xs", "IQ4_XS"),
                      ("llama3.1-8b-q5_k_m", "Q5_K"), ("llama3.1-8b-q8_0", "Q8_0"),
                      ("llama3.1-8b-q6_k", "Q6_K")):  # fmt: skip
        assert traced[name]["in_graph_vs_isolated"][typ] < 0.95, name
    assert traced["llama3.1-8b-f16"]["in_graph_vs_isolated"]["F16"] >= 1.0
