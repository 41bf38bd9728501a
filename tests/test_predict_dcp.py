"""Decode context parallel (``--dcp``, vLLM's --decode-context-parallel-size) in predict: MLA's
latent KV sharded by token over the TP ranks, the attention over the local shard for the
gathered heads, and the three collectives per MLA layer vLLM's ``ag_rs`` backend adds."""

from __future__ import annotations

import json

import pytest

from ceiling.cli import main
from ceiling.errors import CeilingError
from ceiling.predict.api import PredictRequest, predict
from ceiling.predict.collectives import ring_us
from ceiling.predict.core import setup
from ceiling.predict.ops import build_ops
from ceiling.predict.opspec import AttentionShape, CommShape, MlaShape, OpSpec
from ceiling.predict.resolved import Setup
from ceiling.predict.step import kv_bytes_per_token_gpu
from ceiling.spec.hardware import load_link

KIMI = dict(model="kimi-k2.5", gpu="rtx-pro-6000", gpus=8, link="pcie5-switch", tp=8,
            kv_dtype="fp8")  # fmt: skip


def _ops(**kw: object) -> tuple[Setup, dict[str, OpSpec]]:
    """(the setup, the ops of its MLA layer group by name: the groups of many layers)."""
    req = PredictRequest.model_validate({**KIMI, **kw})
    s, _ = setup(req)
    ops = build_ops(s, req.batch, req.context)
    return s, {op.name: op for op in ops if op.count >= 2}


def test_dcp_reads_one_shard_of_the_latent_cache_for_the_gathered_heads(priors_only):
    s1, one = _ops(context=131072, batch=2)
    s8, eight = _ops(context=131072, batch=2, dcp=8)
    a1, a8 = one["attention.mla"], eight["attention.mla"]
    assert isinstance(a1.shape, MlaShape) and isinstance(a8.shape, MlaShape)
    # KV bytes per rank: 1/8 (the latent cache is replicated on every TP rank without DCP)
    assert a8.kv_bytes == pytest.approx(a1.kv_bytes / 8, rel=1e-6)
    # the same FLOPs per rank: 8x the heads over 1/8 of the tokens
    assert a8.flops == pytest.approx(a1.flops, rel=1e-6)
    assert a8.shape.heads == a1.shape.heads * 8 and a8.shape.context == 131072 / 8
    # the per-GPU KV figure that memory and capacity use shrinks the same way
    k1, _ = kv_bytes_per_token_gpu(s1, 131072)
    k8, _ = kv_bytes_per_token_gpu(s8, 131072)
    assert k8 == pytest.approx(k1 / 8)


def test_dcp_adds_three_collectives_per_mla_layer_with_their_message_sizes(priors_only):
    B = 2
    s, ops = _ops(context=4096, batch=B, dcp=4)
    mla = s.spec.mla
    layers = sum(1 for layer in s.spec.layers if layer.attention == "mla")
    heads_r = s.spec.heads // 8
    width = mla["kv_lora_rank"] + mla["qk_rope_head_dim"]  # 576: the absorbed query
    q, lse = ops["dcp.query_allgather"].shape, ops["dcp.lse_allgather"].shape
    out = ops["dcp.out_reduce_scatter"].shape
    assert isinstance(q, CommShape) and isinstance(lse, CommShape) and isinstance(out, CommShape)
    # the grouped op counts cover every MLA layer (the first dense layer is its own group)
    every = build_ops(s, B, 4096)
    assert sum(op.count for op in every if op.name == "dcp.query_allgather") == layers
    assert q.collective == "allgather" and q.ranks == 4
    assert q.bytes == B * heads_r * width * 2  # bf16, this rank's heads
    assert lse.bytes == B * heads_r * 4 * 4  # fp32 LSE of the 4x gathered heads
    assert out.collective == "reducescatter"
    assert out.bytes == B * heads_r * 4 * mla["kv_lora_rank"] * 2
    assert "dcp.lse_correct" in ops
    _, none = _ops(context=4096, batch=B)
    assert not any(name.startswith("dcp.") for name in none)


def test_ring_collective_latency_grows_with_ranks_and_bytes():
    link = load_link("pcie5-switch")
    c = link.nccl
    assert ring_us(link, 1, 1e6) == 0.0
    assert ring_us(link, 8, 8e6) == pytest.approx(
        c.base_us + 7 * c.hop_us + 7 / 8 * 8e6 / (c.busbw_GBps * 1e3)
    )
    assert ring_us(link, 8, 1e3) > ring_us(link, 4, 1e3)


def test_dcp_pays_at_long_context_and_costs_at_short_context(priors_only):
    # the collectives are a fixed cost per layer; the KV read they save grows with the context
    short = predict(PredictRequest(**KIMI, context=1024))
    short8 = predict(PredictRequest(**KIMI, context=1024, dcp=8))
    assert short8.decode_tok_s_per_stream < short.decode_tok_s_per_stream * 0.9
    long = predict(PredictRequest(**KIMI, context=262144))
    long8 = predict(PredictRequest(**KIMI, context=262144, dcp=8))
    assert long8.components_ms["kv"] < long.components_ms["kv"] / 4
    assert long8.decode_tok_s_per_stream > long.decode_tok_s_per_stream
    # KV capacity per replica: the shards add up
    assert long8.kv_capacity_tokens > 7 * long.kv_capacity_tokens
    assert long8.deployment.dcp == 8
    assert any("dcp=8" in a for a in long8.assumptions)
    # expected never below the bound
    assert long8.bound.decode_ms_per_token <= long8.decode_ms_per_token


def test_what_if_offers_dcp_for_mla_at_long_context_only(priors_only):
    long = predict(PredictRequest(**KIMI, context=131072, what_if=True))
    rows = [w for w in long.what_if if w.change.startswith("DCP=8")]
    assert len(rows) == 1 and rows[0].decode_tok_s_per_stream > 0
    short = predict(PredictRequest(**KIMI, context=4096, what_if=True))
    assert not any(w.change.startswith("DCP") for w in short.what_if)
    gqa = predict(PredictRequest(model="llama-3.1-70b", gpu="h100-sxm", tp=4, context=131072,
                                 what_if=True))  # fmt: skip
    assert not any(w.change.startswith("DCP") for w in gqa.what_if)
    on = predict(PredictRequest(**KIMI, context=131072, dcp=8, what_if=True))
    off = [w for w in on.what_if if w.change.startswith("DCP off")]
    assert len(off) == 1
    # engines without DCP are offered without it (not refused)
    sg = next(w for w in on.what_if if w.change == "engine sglang")
    assert sg.decode_tok_s_per_stream > 0 and "has no DCP" in sg.note


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        (dict(dcp=3), "must divide --tp 8"),
        (dict(dcp=16), "must divide --tp 8"),
        (dict(dcp=8, engine="sglang"), "sglang has no decode context parallel"),
        (dict(dcp=8, engine="trtllm"), "trtllm has no decode context parallel"),
    ],
)
def test_impossible_dcp_is_refused(priors_only, kw, needle):
    with pytest.raises(CeilingError, match=needle):
        predict(PredictRequest(**{**KIMI, **kw}))


def test_gqa_dcp_follows_vllms_rules(priors_only):
    # vLLM config/model.py: TP above the KV heads, dcp <= TP / KV heads, q heads per KV head
    with pytest.raises(CeilingError, match="needs --tp above the model's 8 KV heads"):
        predict(PredictRequest(model="llama-3.1-70b", gpu="h100-sxm", tp=4, dcp=4))
    qwen = dict(model="qwen3-235b-a22b", gpu="h200", tp=8)  # 4 KV heads, 64 query heads
    with pytest.raises(CeilingError, match="exceeds tp / KV heads = 2"):
        predict(PredictRequest(**qwen, dcp=4))
    # a model without attention DCP shards (Gated DeltaNet only) would name the kinds; a GQA
    # model at TP 8 over 4 KV heads shards each KV head's two replicas by token
    req = PredictRequest(**qwen, dcp=2, context=131072, batch=2)
    s, _ = setup(req)
    every = build_ops(s, 2, 131072)
    attn = next(op for op in every if op.name == "attention.decode")
    s1, _ = setup(PredictRequest(**qwen, context=131072, batch=2))
    attn1 = next(op for op in build_ops(s1, 2, 131072) if op.name == "attention.decode")
    assert attn.kv_bytes == pytest.approx(attn1.kv_bytes / 2)
    assert isinstance(attn.shape, AttentionShape) and isinstance(attn1.shape, AttentionShape)
    assert attn.shape.heads == 2 * attn1.shape.heads and attn.shape.kv_heads == 1
    q = next(op for op in every if op.name == "dcp.query_allgather").shape
    out = next(op for op in every if op.name == "dcp.out_reduce_scatter").shape
    assert isinstance(q, CommShape) and isinstance(out, CommShape)
    hd, heads_r = s.spec.head_dim, s.spec.heads // 8
    assert q.bytes == 2 * heads_r * hd * 2 and out.bytes == 2 * heads_r * 2 * hd * 2
    k1, _ = kv_bytes_per_token_gpu(s1, 131072)
    k2, _ = kv_bytes_per_token_gpu(s, 131072)
    assert k2 == pytest.approx(k1 / 2)
    # the what-if offers the largest DCP the layout allows
    p = predict(PredictRequest(**qwen, context=131072, what_if=True))
    assert [w.change.split(" ")[0] for w in p.what_if if w.change.startswith("DCP")] == ["DCP=2"]


def test_cli_dcp_flag_and_error(priors_only, capsys):
    rc = main(["predict", "--model", "kimi-k2.5", "--gpu", "h200", "--tp", "8", "--dcp", "8",
               "--context", "131072", "--json"])  # fmt: skip
    assert rc in (0, None)
    data = json.loads(capsys.readouterr().out)
    assert data["deployment"]["dcp"] == 8
    assert any(op["name"] == "dcp.out_reduce_scatter" for op in data["expected"]["ops"])
    rc = main(["predict", "--model", "kimi-k2.5", "--gpu", "h200", "--tp", "8", "--dcp", "5"])
    err = capsys.readouterr().err
    assert rc == 2 and "error:" in err and "fix:" in err and "Traceback" not in err


def test_published_dcp_rows_are_scored_with_their_dcp(priors_only):
    """V005/V006 (Kimi-K2.5 at DCP=8 on 8 RTX PRO 6000s) were bound-only while DCP was not
    modelled; the row's ``dcp`` column now reaches the request and the rows are scored."""
    import csv

    from validation.calibration import reference_dir, request_for

    with (reference_dir() / "decode_validation.csv").open() as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    for rid in ("V005", "V006"):
        row = rows[rid]
        assert row["use"] == "all" and row["seen"] == "yes" and "dcp 8" in row["seen_note"]
        req, _ = request_for(row)
        assert req is not None and req.dcp == 8
    assert request_for(rows["V004"])[0].dcp == 1  # type: ignore[union-attr]


def test_doctor_predicts_the_servers_dcp_where_predict_models_it(priors_only):
    """A vLLM server's engine-config line carries decode_context_parallel_size; doctor's
    prediction takes it where predict models it and leaves it out (not refusing) elsewhere."""
    from ceiling.diagnose.expect import _context_parallel
    from ceiling.diagnose.facts import EngineFacts

    facts = EngineFacts(decode_context_parallel_size=8)
    assert _context_parallel(facts, "kimi-k2.5", "vllm") == {"dcp": 8}
    assert _context_parallel(facts, "llama-3.1-70b", "vllm") == {}  # TP 8 = its 8 KV heads
    gqa = EngineFacts(tensor_parallel_size=8, decode_context_parallel_size=2)
    assert _context_parallel(gqa, "qwen3-235b-a22b", "vllm") == {"dcp": 2}
    assert _context_parallel(facts, "kimi-k2.5", "sglang") == {}
    assert _context_parallel(EngineFacts(decode_context_parallel_size=1), "kimi-k2.5", "vllm") == {}
    assert _context_parallel(None, "kimi-k2.5", "vllm") == {}


def test_long_context_kv_read_and_attention_grow_with_the_context(priors_only):
    """64K-256K: the attention op reads B x S x KV bytes per rank (GQA: the rank's KV heads),
    its time grows with S, and the KV share of the step with it; fewer sequences fit."""
    base = dict(model="llama-3.1-70b", gpu="h200", tp=4, kv_dtype="fp8")
    steps = {s: predict(PredictRequest(**base, context=s)) for s in (65536, 131072, 262144)}
    kv = {s: p.details.kv_bytes_read_per_gpu for s, p in steps.items()}
    assert kv[131072] == pytest.approx(2 * kv[65536], rel=1e-3)
    assert kv[262144] == pytest.approx(4 * kv[65536], rel=1e-3)
    # llama-3.1-70b: 80 layers x 8 KV heads / TP 4 x 128 x 2 (K, V) x 1 byte (fp8) per token
    assert kv[65536] == pytest.approx(65536 * 80 * 2 * 128 * 2 * 1, rel=1e-3)
    attn = {
        s: sum(op.ms for op in p.expected.ops if op.name.startswith("attention"))
        for s, p in steps.items()
    }
    assert attn[65536] < attn[131072] < attn[262144]
    # the extra context costs at least its extra bytes at the datasheet bandwidth
    from ceiling.spec.hardware import load_gpu

    bw = load_gpu("h200").mem_bw_GBps * 1e9
    assert attn[262144] - attn[65536] >= (kv[262144] - kv[65536]) / bw * 1e3
    share = {s: p.components_ms["kv"] / p.decode_ms_per_token for s, p in steps.items()}
    assert share[65536] < share[131072] < share[262144]
    assert steps[262144].max_batch_at_context < steps[65536].max_batch_at_context
