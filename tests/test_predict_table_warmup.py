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
