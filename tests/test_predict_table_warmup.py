"""A GEMM table's first row set timed before the kernel was warm is read from the next row
(``tables.lookup._warm_rows``): vLLM's CUTLASS FP8 per-tensor kernel on the B200 runs one
config for 1-16 tokens, yet its 1-token rows carry ~14 us more fixed cost than its 2-token
rows, which priced FP8 per-tensor far slower than block-128 in the what-if."""

from __future__ import annotations

from importlib import util

import pytest

pytestmark = pytest.mark.skipif(
    util.find_spec("aiconfigurator_core") is None, reason="tables extra absent"
)

KEY = [("CutlassFP8ScaledMM", "fp8")]


def test_a_warm_up_first_row_is_read_from_the_next():
    from ceiling.predict.tables import gemm_measured

    one = gemm_measured("b200_sxm", "vllm", KEY, 1, 4096, 4096)
    two = gemm_measured("b200_sxm", "vllm", KEY, 2, 4096, 4096)
    assert one is not None and two is not None
    # measured: 24.6 us at one token, 9.2 us at two (the same kernel, one M tile)
    assert one.us == pytest.approx(two.us)
    assert one.us < 12


def test_a_warm_first_row_is_kept():
    """The bf16 table's 1-token rows fit no warm-up offset: they are read as measured."""
    from ceiling.predict.tables import gemm_measured
    from ceiling.predict.tables.store import _raw

    key = "vllm/0.24.0/torch.nn.functional.linear/bfloat16"
    row = {(int(n), int(k)): t for n, k, t in _raw("b200_sxm", "gemm")[key]["1"]}
    pats = [("torch.nn.functional.linear", "bfloat16")]
    one = gemm_measured("b200_sxm", "vllm", pats, 1, 4096, 4096)
    assert one is not None and one.us == pytest.approx(row[(4096, 4096)])


def test_a_table_refused_by_the_check_gives_way_to_the_next_candidate():
    """vLLM's DeepGEMM block-128 table on the B200 holds its JIT (175-273 us at every shape):
    the check refuses it, and the next candidate table of the same format (vLLM's CUTLASS
    block-128, refused too; then TensorRT-LLM's DeepGEMM) is read before the prior."""
    from ceiling.predict.core import setup
    from ceiling.predict.schema import PredictRequest
    from ceiling.predict.step import decode_step

    req = PredictRequest(model="llama-3.1-70b-fp8", gpu="b200", tp=1, context=1024)
    s, _ = setup(req.model_copy(update={"weight_format": "fp8"}), None)
    prev = 0.0
    for b in (1, 2, 8, 32, 64):
        step = decode_step(s, b, 1024)
        gemms = [o for o in step.ops if o.family == "gemm_fp8_block"]
        assert gemms and all(o.source == "table" for o in gemms)
        assert all("DeepGemmFp8BlockScaledMMKernel" in o.note for o in gemms)
        assert all(not o.note.startswith("vllm/") for o in gemms)
        assert step.ms >= prev
        prev = step.ms


def test_the_next_candidate_leaves_out_only_what_was_refused():
    from ceiling.predict.tables import gemm_measured

    pats = [("DeepGemmFp8BlockScaled", "fp8_block"), ("deepgemm", "fp8_block")]
    first = gemm_measured("b200_sxm", "vllm", pats, 1, 8192, 8192)
    assert first is not None and first.key.startswith("vllm/")
    nxt = gemm_measured("b200_sxm", "vllm", pats, 1, 8192, 8192, (first.key,))
    assert nxt is not None and nxt.key != first.key and "deepgemm" in nxt.key
