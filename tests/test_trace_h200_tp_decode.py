"""The H200 trace recorded by the current one-GPU path (experiments/gpu/tp_decode.py --tp 1 --trace,
2026-12-03, experiments/results/2026-12-03_h200-trace-decode/): Qwen3-30B-A3B shape, batch 1, in a
CUDA graph, MoE experts through torch._grouped_mm, whose CUTLASS kernel CUPTI records under its
mangled name. The 2026-12-02 fixtures (retired trace_decode.py) looped over experts with plain
GEMMs, so none of them holds this kernel."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from ceiling.trace import read_trace, split

FIX = Path(__file__).parent / "fixtures" / "trace"
TRACE = FIX / "h200-qwen3-30b-a3b-b1-graph-grouped-mm.pt.trace.json.gz"
STEPS = FIX / "h200-qwen3-30b-a3b-b1-graph-grouped-mm.steps.json"  # tp_decode's steps_rank0.json


def test_grouped_mm_moe_step_is_classified_and_adds_up_to_its_cuda_events() -> None:
    sp = split([read_trace(TRACE)], "generic")
    assert sp.coverage >= 0.95, [(u.name[:80], u.ms) for u in sp.unmatched]
    assert sp.coverage == 1.0  # ratchet: every kernel of the step is named
    # classes + idle is the measured step, and that step is the one the CUDA events timed
    assert sum(c.ms for c in sp.classes) + sp.idle_ms == pytest.approx(sp.step_ms, abs=1e-3)
    clock = json.loads(STEPS.read_text())
    assert clock["clock"] == "cuda_events" and sp.steps == clock["steps"] == 6
    assert sp.step_ms == pytest.approx(statistics.fmean(clock["steps_ms"]), rel=0.05)
    # two grouped GEMMs per MoE layer (gate/up and down), 48 layers, as MoE experts
    experts = next(c for c in sp.classes if c.op_class == "moe_experts")
    assert experts.calls == 2 * 48 and "torch_grouped_mm" in experts.impl
    assert sp.class_ms("gemm") > 0 and sp.class_ms("attention") > 0
    assert sp.class_ms("allreduce") == 0  # one GPU
