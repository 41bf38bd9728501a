"""The shared expert on a second CUDA stream (``ceiling.predict.overlap``): an engine rule read
from vLLM's and SGLang's source, applied only where it holds, hiding fixed costs and never bytes."""

from __future__ import annotations

import pytest

from ceiling.predict.api import PredictRequest, predict

KIMI = dict(model="kimi-k2.5", gpu="rtx-pro-6000", gpus=8, link="pcie5-switch", tp=8)


def _stream(p):
    return p.details.shared_expert_stream


def _ops(block):
    out: dict[str, float] = {}
    for o in block.ops:
        out[o.name] = out.get(o.name, 0.0) + o.ms
    return out


def test_vllm_hides_the_shared_experts_fixed_costs_not_its_bytes(priors_only):
    p = predict(PredictRequest(**KIMI))
    stream = _stream(p)
    assert stream and stream.hidden_ms > 0 and "shared_experts.py" in stream.rule
    assert any("second CUDA stream" in a for a in p.assumptions)
    ops = {o.name: o for o in p.expected.ops}
    assert "on a second stream" in ops["moe.shared.gate_up"].note
    # the step still sums its ops, and the MoE pair is never faster than reading its weights
    assert sum(_ops(p.expected).values()) == pytest.approx(p.decode_ms_per_token, rel=0.01)
    off = predict(PredictRequest(**KIMI, batch=300, context=256))  # above vLLM's 256 tokens
    assert _stream(off) is None
    moe = ("moe.router", "moe.topk", "moe.experts", "moe.shared.gate_up", "moe.shared.act",
           "moe.shared.down")  # fmt: skip
    on_ms = sum(v for k, v in _ops(p.expected).items() if k in moe)
    off_single = predict(PredictRequest(**KIMI, engine="trtllm"))  # no rule: in line
    assert _stream(off_single) is None
    line_ms = sum(v for k, v in _ops(off_single.expected).items() if k in moe)
    assert on_ms < line_ms
    assert p.components_ms["weights"] == pytest.approx(off_single.components_ms["weights"])
    # the bound keeps its weight reads
    assert p.bound.components_ms["weights"] == pytest.approx(
        off_single.bound.components_ms["weights"], rel=0.01
    )


def test_the_rule_holds_only_where_it_was_read(priors_only):
    # SGLang: DeepSeek-style MoE (Kimi) yes, Qwen3.5 MoE (its file not read) in line
    assert _stream(predict(PredictRequest(**KIMI, engine="sglang")))
    qwen = dict(model="qwen3.5-397b-a17b-nvfp4", gpu="rtx-pro-6000", gpus=4, tp=4)
    assert _stream(predict(PredictRequest(**qwen, engine="vllm")))
    assert _stream(predict(PredictRequest(**qwen, engine="sglang"))) is None
    # ROCm keeps vLLM's aux stream off outside gfx950: MI300X runs it in line
    assert _stream(predict(PredictRequest(model="deepseek-v3", gpu="mi300x", gpus=8, tp=8))) is None
    assert _stream(predict(PredictRequest(model="deepseek-v3", gpu="h200", gpus=8, tp=8)))
    # a model without a shared expert has nothing to overlap
    assert _stream(predict(PredictRequest(model="minimax-m2.5", gpu="h200", gpus=4, tp=4))) is None
