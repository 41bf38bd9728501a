"""SGLang's own step rules read in its source (data/predict/engines.yaml: qk_norm, dsa and the
speculative overlap_off): each changes the op list or the host term only where SGLang does."""

from __future__ import annotations

import pytest

from ceiling.predict.api import PredictRequest, predict
from ceiling.predict.schema import OpRecord, Prediction
from ceiling.spec.deployment import engines_table

GLM5 = dict(model="glm-5-fp8", gpu="b200", gpus=8, tp=8, context=700)
QWEN3 = dict(model="qwen3-235b-a22b", gpu="b200", gpus=8, tp=8, context=820)


def _ops(p: Prediction) -> dict[str, OpRecord]:
    return {op.name: op for op in p.expected.ops}


def test_sglang_dsa_indexer_chain_and_fp8_cache(priors_only):
    rule = engines_table()["sglang"].dsa
    assert rule is not None
    sg = predict(PredictRequest(**GLM5, engine="sglang"))
    ops = _ops(sg)
    # weights_proj and wq_b are two GEMMs on the main stream; the indexer's and the sparse
    # decode's small kernels are their own ops, with the kernel counts read in the source
    assert {"mla.indexer_gates", "mla.indexer_proj", "mla.indexer_prep", "mla.sparse_prep"} <= set(
        ops
    )
    layers = sum(op.count for op in sg.expected.ops if op.name == "attention.mla")
    assert layers == 78
    assert any("fp8_e4m3" in a for a in sg.assumptions)  # --kv-dtype auto: fp8 from SM100
    # vLLM keeps its own path (not read to the kernel): one indexer GEMM, bf16 cache by default
    vl = predict(PredictRequest(**GLM5, engine="vllm"))
    assert "mla.indexer_prep" not in _ops(vl) and "mla.indexer_gates" not in _ops(vl)
    assert not any("fp8_e4m3" in a for a in vl.assumptions)
    # before SM100 SGLang's DSA cache stays bf16
    h200 = predict(PredictRequest(**{**GLM5, "gpu": "h200"}, engine="sglang"))
    assert not any("fp8_e4m3" in a for a in h200.assumptions)
    # the chain costs what its kernels cost: more than the same step without it
    assert sg.decode_ms_per_token > vl.decode_ms_per_token * 0.9


def test_dsa_main_attention_reads_the_top_k_tokens(priors_only):
    """GLM-5's index_topk (2048) caps the main attention's KV read at long context."""
    short = predict(PredictRequest(**{**GLM5, "context": 2048}, engine="vllm"))
    long = predict(PredictRequest(**{**GLM5, "context": 65536}, engine="vllm"))
    att = [_ops(p)["attention.mla"] for p in (short, long)]
    assert att[1].ms == pytest.approx(att[0].ms, rel=0.05)
    # the indexer still scores every cached token (its fixed cost dominates at one sequence)
    assert _ops(long)["mla.indexer_scores"].ms > _ops(short)["mla.indexer_scores"].ms


def test_sglang_qwen3_qk_norm(priors_only):
    sg = predict(PredictRequest(**QWEN3, engine="sglang"))
    qk = _ops(sg)["attn.qk_norm"]
    assert qk.count == 94  # one kernel per attention layer on the critical path
    assert "attn.qk_norm" not in _ops(predict(PredictRequest(**QWEN3, engine="vllm")))
    # models without per-head q/k norm do not get it
    assert "attn.qk_norm" not in _ops(
        predict(PredictRequest(model="gpt-oss-120b", gpu="b200", gpus=8, tp=8, engine="sglang"))
    )


def test_sglang_speculative_decoding_runs_without_the_overlap_scheduler(priors_only):
    e = engines_table()["sglang"]
    req = dict(**GLM5, engine="sglang", spec="mtp", spec_tokens=3, spec_acceptance_length=3.52)
    spec = predict(PredictRequest(**req))
    tau = spec.details.speculative.acceptance_length
    # the step's exposed host time is the synchronous scheduler's, once per step
    assert spec.components_ms["host"] * tau == pytest.approx(e.host_sync_ms, rel=1e-3)
    assert predict(PredictRequest(**GLM5, engine="sglang")).components_ms["host"] == pytest.approx(
        e.host_ms, rel=1e-3
    )
    # a spec-v2 server (overlap on): --async-scheduling
    v2 = predict(PredictRequest(**req, async_scheduling=True))
    assert v2.components_ms["host"] * tau == pytest.approx(e.host_ms, rel=1e-3)
    # vLLM keeps async scheduling with MTP
    vl = predict(PredictRequest(**{**req, "engine": "vllm"}))
    assert vl.components_ms["host"] * tau == pytest.approx(
        engines_table()["vllm"].host_ms, rel=1e-3
    )
