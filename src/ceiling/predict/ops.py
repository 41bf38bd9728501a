"""The decode step as a list of operations, each with its shape, bytes and count per step.

One GPU of a replica (the busiest one under EP), batch B, context S. Per layer, by kind:

- attention: GQA/MHA (fused qkv GEMM, rope + KV write, decode attention over the cache, o_proj),
  MLA (replicated q_a/kv_a GEMM, lora norms, q_b GEMM, the absorbed W_UK/W_UV batched GEMMs in
  bf16, MLA decode over the latent cache, o_proj; DSA indexer when the config has one),
  linear/hybrid (Gated DeltaNet: in-projections, causal conv update, recurrent state update,
  gated norm, out-projection);
- MLP: dense (gate_up, activation, down) or MoE (router GEMM, top-k, one fused grouped-GEMM op
  over the touched experts on this rank, shared expert GEMMs);
- norms, residual adds; the allreduces after attention and MLP under TP (all-to-all with DP
  attention + EP); and per step: embedding, final norm, lm_head, logits gather, sampling.

Nothing here is timed: ``ceiling.predict.evidence`` gives each op its latency (profile, table
or prior) and its bound; ``ceiling.predict.step`` sums them.
"""

from __future__ import annotations

import math

from ceiling.predict.datafiles import kernels
from ceiling.predict.moe import expected_distinct, expected_max_load
from ceiling.predict.opspec import (
    AttentionShape,
    CommShape,
    GdnShape,
    GemmShape,
    MlaShape,
    MoeShape,
    OpSpec,
)
from ceiling.predict.resolved import Setup
from ceiling.spec.deployment import EngineEntry, engines_table
from ceiling.spec.model import LayerSpec, Module


def _fmt_of(mods: list[Module]) -> tuple[str, str]:
    """(format name, compute dtype) of a group of modules: the one holding most bytes."""
    if not mods:
        return "bf16", "bf16"
    m = max(mods, key=lambda x: x.nbytes)
    return m.fmt.name, m.fmt.compute


def _gemm(
    name: str, count: float, mods: list[Module], share: float, m: float, n: float, k: float
) -> OpSpec:
    """A GEMM over ``mods`` (fused), ``share`` of their bytes on this GPU, output n x input k."""
    fmt, comp = _fmt_of(mods)
    nbytes = sum(x.nbytes for x in mods) * share
    return OpSpec(
        name,
        "gemm",
        count,
        weight_bytes=nbytes,
        flops=2.0 * m * n * k,
        fmt=fmt,
        compute=comp,
        shape=GemmShape(m=m, n=max(int(n), 1), k=max(int(k), 1)),
    )


def _small(name: str, count: float, nbytes: float, kernels: int = 1) -> OpSpec:
    return OpSpec(name, "elementwise", count, act_bytes=nbytes, kernels=kernels)


def _engine(s: Setup) -> EngineEntry | None:
    """The engine's rules of ``data/predict/engines.yaml`` (None for an engine it lacks)."""
    return engines_table().get(s.dep.engine)


def build_ops(s: Setup, batch: int, context: int) -> list[OpSpec]:
    """Every op of one decode step of replica ``s``."""
    spec, d = s.spec, s.dep
    tp = d.tp
    B = float(batch)
    h = spec.hidden
    by_layer: dict[int, list[Module]] = {}
    per_step: dict[str, Module] = {}
    for mod in spec.modules:
        if mod.layer is None:
            per_step[mod.kind] = mod
        else:
            by_layer.setdefault(mod.layer, []).append(mod)

    # group identical layers (same attention/MLP kind and formats) so ops carry counts
    groups: dict[tuple[object, ...], tuple[LayerSpec, list[Module], int]] = {}
    for layer in spec.layers:
        mods = by_layer.get(layer.index, [])
        key = (
            layer.attention,
            layer.mlp,
            layer.window if (layer.window and context > layer.window) else None,
            tuple((m.kind, m.name.split(".")[-1], m.fmt.name, m.rows, m.cols) for m in mods),
        )
        if key in groups:
            ls, ms, n = groups[key]
            groups[key] = (ls, ms, n + 1)
        else:
            groups[key] = (layer, mods, 1)

    ops: list[OpSpec] = []
    kvb = s.kv_bytes
    for layer, mods, n in groups.values():
        kinds: dict[str, list[Module]] = {}
        for m in mods:
            kinds.setdefault(m.kind, []).append(m)
        ops.append(_small("norm.add_rmsnorm", 2 * n, 3 * B * h * 2))
        if layer.attention == "mla":
            ops += _mla_ops(s, layer, kinds, n, B, context, kvb)
        elif layer.attention == "linear":
            ops += _gdn_ops(s, layer, kinds, n, B)
        else:
            ops += _gqa_ops(s, layer, kinds, n, B, context, kvb)
        if layer.mlp == "moe":
            ops += _moe_ops(s, kinds, n, B)
        else:
            dense = kinds.get("mlp", [])
            gate_up = [m for m in dense if not m.name.endswith("down_proj")]
            down = [m for m in dense if m.name.endswith("down_proj")]
            inter = gate_up[0].rows if gate_up else 0
            ops.append(_gemm("mlp.gate_up", n, gate_up, 1 / tp, B, 2 * inter / tp, h))
            ops.append(_small("mlp.act", n, B * 3 * inter / tp * 2))
            ops.append(_gemm("mlp.down", n, down, 1 / tp, B, h, inter / tp))
    ops += _comm_ops(s, B)
    # per step
    emb = per_step.get("embed")
    ops.append(
        _small("embedding", 1, B * h * 2 + (emb.nbytes / max(emb.rows, 1) * B if emb else 0))
    )
    ops.append(_small("norm.final", 1, 2 * B * h * 2))
    lm = per_step.get("lm_head")
    if lm is not None:
        ops.append(_gemm("lm_head", 1, [lm], 1 / tp, B, spec.vocab / tp, h))
    ops.append(OpSpec("sampling", "sampling", 1, act_bytes=B * spec.vocab * 4 * 3, kernels=6))
    ops.append(OpSpec("host", "host", 1))
    if s.rules.kernels == "pytorch":
        ops.append(_unfused(s, ops))
    return [op for op in ops if op.count > 0]


def _unfused(s: Setup, ops: list[OpSpec]) -> OpSpec:
    """Plain PyTorch (engine `generic`) runs more small kernels than the fused ops above: the
    per-block counts in constants.yaml (`kernels.pytorch`, counted with torch.profiler on an
    H200) minus the ones already listed."""
    table = s.consts.kernels["pytorch"]
    want = table.per_step.other
    for layer in s.spec.layers:
        attn = {"mla": "attn_mla", "linear": "attn_linear"}.get(layer.attention, "attn_gqa")
        want += table.block(attn).other
        if layer.mlp == "moe":
            want += table.moe.other + (table.shared_expert.other if s.spec.n_shared else 0)
        else:
            want += table.mlp_dense.other
    have = sum(
        op.count * op.kernels for op in ops if op.kind in ("elementwise", "attention", "mla", "gdn")
    )
    return _small("pytorch.unfused_kernels", max(want - have, 0), 0.0)


Kinds = dict[str, list[Module]]


def _gqa_ops(
    s: Setup, layer: LayerSpec, kinds: Kinds, n: int, B: float, context: int, kvb: float
) -> list[OpSpec]:
    spec, tp = s.spec, s.dep.tp
    h, hd = spec.hidden, spec.head_dim
    attn = kinds.get("attn", [])
    qkv = [m for m in attn if not m.name.endswith("o_proj")]
    o = [m for m in attn if m.name.endswith("o_proj")]
    kv_r = max(1, math.ceil(layer.kv_heads / tp))
    heads_r = max(1, spec.heads // tp)
    q_rows = sum(m.rows for m in qkv if m.name.endswith("q_proj"))
    kv_rows_total = sum(m.rows for m in qkv if not m.name.endswith("q_proj"))
    kv_share = kv_r / max(layer.kv_heads, 1)
    qkv_bytes = (
        sum(m.nbytes for m in qkv if m.name.endswith("q_proj")) / tp
        + sum(m.nbytes for m in qkv if not m.name.endswith("q_proj")) * kv_share
    )
    fmt, comp = _fmt_of(qkv)
    n_out = q_rows / tp + kv_rows_total * kv_share
    ops = [
        OpSpec(
            "attn.qkv_proj",
            "gemm",
            n,
            weight_bytes=qkv_bytes,
            flops=2 * B * n_out * h,
            fmt=fmt,
            compute=comp,
            shape=GemmShape(m=B, n=int(n_out), k=h),
        ),
        _small("attn.rope_kv_write", n, B * (n_out * 2 + 2 * kv_r * hd * kvb)),
    ]
    e = _engine(s)
    qk = e.qk_norm if e is not None else None
    if qk is not None and spec.architecture in qk.architectures:
        # per-head q/k RMSNorm before rope (engines.yaml qk_norm: the model file read)
        ops.insert(
            1, _small("attn.qk_norm", n, B * (q_rows / tp + 2 * kv_r * hd) * 2 * 2, qk.kernels)
        )
    ctx = min(context, layer.window) if layer.window else context
    # DCP (vLLM, GQA: TP above the KV heads, so each KV head is replicated over TP/kv ranks):
    # the replicas shard the tokens; the rank attends ceil(S/dcp) tokens of its KV head for the
    # group's gathered query heads (flash_attn.py: all_gather of the query over the DCP group)
    dcp = s.dep.dcp
    ctx_r = math.ceil(ctx / dcp)
    heads_a = heads_r * dcp
    ops.append(
        OpSpec(
            "attention.decode" + (".sliding" if layer.window else ""),
            "attention",
            n,
            kv_bytes=B * ctx_r * 2 * kv_r * hd * kvb,
            flops=4.0 * B * ctx_r * heads_a * hd,
            kernels=2,
            shape=AttentionShape(
                batch=B,
                context=ctx_r,
                heads=heads_a,
                kv_heads=kv_r,
                head_dim=hd,
                kv_dtype="fp8" if kvb <= 1 else "bfloat16",
            ),
        )
    )
    if dcp > 1:
        ops += _dcp_ops(s, n, B, heads_r, heads_a, q_width=hd, out_width=hd)
    ops.append(_gemm("attn.o_proj", n, o, 1 / tp, B, h, spec.heads * hd / tp))
    return ops


def _mla_ops(
    s: Setup, layer: LayerSpec, kinds: Kinds, n: int, B: float, context: int, kvb: float
) -> list[OpSpec]:
    spec, tp = s.spec, s.dep.tp
    h, mla = spec.hidden, spec.mla
    heads_r = max(1, spec.heads // tp)
    rep = kinds.get("attn_replicated", [])
    attn = kinds.get("attn", [])
    main_rep = [m for m in rep if "indexer" not in m.name]
    idx = [m for m in rep if "indexer" in m.name]
    q_b = [m for m in attn if m.name.endswith("q_b_proj") or m.name.endswith("q_proj")]
    kv_b = [m for m in attn if m.name.endswith("kv_b_proj")]
    o = [m for m in attn if m.name.endswith("o_proj")]
    ops = [
        _gemm("mla.q_a_kv_a_proj", n, main_rep, 1.0, B, sum(m.rows for m in main_rep), h),
        _small("mla.lora_norms", n, B * (mla["q_lora_rank"] + mla["kv_lora_rank"]) * 4, 2),
    ]
    if q_b:
        q_in = mla["q_lora_rank"] or h
        ops.append(_gemm("mla.q_b_proj", n, q_b, 1 / tp, B, q_b[0].rows / tp, q_in))
    if kv_b:
        # absorbed MLA: W_UK and W_UV run as batched GEMMs in bf16 (vLLM dequantizes them at
        # load: MLACommonImpl.process_weights_after_loading)
        kv_b_bf16 = kv_b[0].rows * kv_b[0].cols * 2 / tp
        nope, v = mla["qk_nope_head_dim"], mla["v_head_dim"]
        uk = kv_b_bf16 * nope / (nope + v)
        for name, nbytes in (("mla.w_uk_bmm", uk), ("mla.w_uv_bmm", kv_b_bf16 - uk)):
            ops.append(
                OpSpec(
                    name,
                    "gemm",
                    n,
                    weight_bytes=nbytes,
                    flops=2 * B * nbytes / 2,
                    shape=GemmShape(m=B * heads_r, n=mla["kv_lora_rank"], k=max(nope, v)),
                )
            )
    ops.append(_small("mla.rope_kv_write", n, B * (mla["kv_lora_rank"] + 64) * 4))
    latent = mla["kv_lora_rank"] + mla["qk_rope_head_dim"]
    ctx = context
    topk = int(mla.get("index_topk", 0))
    if idx:
        # DSA (GLM-5): the indexer scores every cached token, the main attention reads top-k
        index_dim = max((m.rows for m in idx if m.name.endswith("wk")), default=128)
        e = _engine(s)
        dsa = e.dsa if e is not None else None
        if dsa is not None and dsa.indexer_gemms > 1:
            # the engine's indexer runs weights_proj, then wq_b (wk beside it on the alt
            # stream): each its own GEMM on the main stream (engines.yaml dsa)
            gates = [m for m in idx if m.name.endswith("weights_proj")]
            qk = [m for m in idx if m not in gates]
            ops.append(_gemm("mla.indexer_gates", n, gates, 1.0, B, sum(m.rows for m in gates), h))
            ops.append(_gemm("mla.indexer_proj", n, qk, 1.0, B, sum(m.rows for m in qk), h))
        else:
            ops.append(_gemm("mla.indexer_proj", n, idx, 1.0, B, sum(m.rows for m in idx), h))
        if dsa is not None and dsa.indexer_small_kernels:
            q_act = B * sum(m.rows for m in idx if m.name.endswith("wq_b")) * 2
            ops.append(_small("mla.indexer_prep", n, 4 * q_act, dsa.indexer_small_kernels))
        ops.append(
            OpSpec(
                "mla.indexer_scores",
                "attention",
                n,
                kv_bytes=B * context * index_dim * kvb,
                kernels=3,
                shape=AttentionShape(
                    batch=B,
                    context=context,
                    heads=1,
                    kv_heads=1,
                    head_dim=index_dim,
                    kv_dtype="fp8",
                ),
            )
        )
        if topk:
            ctx = min(context, topk)
        if dsa is not None and dsa.attention_small_kernels:
            q_abs = B * heads_r * (mla["kv_lora_rank"] + mla["qk_rope_head_dim"]) * 2
            ops.append(_small("mla.sparse_prep", n, 2 * q_abs, dsa.attention_small_kernels))
    # DCP (vLLM): every rank of the group reads only its 1/dcp of each sequence's latent
    # cache, for the group's gathered heads (H/TP x dcp): the same FLOPs, 1/dcp of the bytes;
    # the query gather, LSE gather, correction and output reduce-scatter are _dcp_ops
    dcp = s.dep.dcp
    ctx_r = math.ceil(ctx / dcp)
    heads_a = min(spec.heads, heads_r * dcp)
    ops.append(
        OpSpec(
            "attention.mla",
            "mla",
            n,
            kv_bytes=B * ctx_r * latent * kvb,
            flops=2.0 * B * ctx_r * heads_a * (2 * mla["kv_lora_rank"] + mla["qk_rope_head_dim"]),
            kernels=2,
            shape=MlaShape(batch=B, context=ctx_r, heads=heads_a),
        )
    )
    if dcp > 1:
        width = mla["kv_lora_rank"] + mla["qk_rope_head_dim"]  # the absorbed query
        ops += _dcp_ops(s, n, B, heads_r, heads_a, q_width=width, out_width=mla["kv_lora_rank"])
    ops.append(_gemm("mla.o_proj", n, o, 1 / tp, B, h, o[0].cols / tp if o else h))
    return ops


def _dcp_ops(
    s: Setup, n: int, B: float, heads_r: int, heads_a: int, q_width: int, out_width: int
) -> list[OpSpec]:
    """What DCP adds to each attention layer (vLLM's ``ag_rs`` backend, engines.yaml): the
    decode query all-gathered over the group (each rank's B x H/TP x ``q_width`` in bf16: MLA's
    absorbed 576-wide query, GQA's head_dim), the fp32 LSE of the gathered heads all-gathered,
    one correction kernel, and the output (B x H/TP x dcp x ``out_width``, bf16: MLA's
    kv_lora_rank, GQA's head_dim) reduce-scattered back to this rank's heads."""
    dcp = s.dep.dcp
    q = B * heads_r * q_width * 2
    lse = B * heads_a * 4
    out = B * heads_a * out_width * 2
    return [
        OpSpec(
            "dcp.query_allgather",
            "comm",
            n,
            act_bytes=q,
            shape=CommShape(collective="allgather", bytes=q, ranks=dcp),
        ),
        OpSpec(
            "dcp.lse_allgather",
            "comm",
            n,
            act_bytes=lse,
            shape=CommShape(collective="allgather", bytes=lse, ranks=dcp),
        ),
        _small("dcp.lse_correct", n, 2 * out + dcp * lse),
        OpSpec(
            "dcp.out_reduce_scatter",
            "comm",
            n,
            act_bytes=out,
            shape=CommShape(collective="reducescatter", bytes=out, ranks=dcp),
        ),
    ]


def _gdn_ops(s: Setup, layer: LayerSpec, kinds: Kinds, n: int, B: float) -> list[OpSpec]:
    spec, tp = s.spec, s.dep.tp
    h = spec.hidden
    lin = kinds.get("linear_attn", [])
    # vLLM and SGLang run two input GEMMs (gdn_linear_attn.py / qwen3_next.py: in_proj_qkvz,
    # in_proj_ba; a checkpoint's split in_proj_qkv/z and in_proj_b/a are stacked into them at
    # load), each with its own fixed cost, and zero the core op's output before it runs
    # (torch.zeros; with the b/a .contiguous() copies at least one more small kernel)
    qkvz = [m for m in lin if m.linear and not m.name.endswith("out_proj")]
    ba = kinds.get("linear_attn_gate", [])
    out = [m for m in lin if m.name.endswith("out_proj")]
    conv = [m for m in lin if m.name.endswith("conv1d")]
    v_dim = out[0].cols if out else h
    ops = [
        _gemm("gdn.in_proj", n, qkvz, 1 / tp, B, sum(m.rows for m in qkvz) / tp, h),
        *(
            [_gemm("gdn.in_proj_ba", n, ba, 1 / tp, B, sum(m.rows for m in ba) / tp, h)]
            if ba
            else []
        ),
        _small("gdn.core_out_init", n, B * v_dim / tp * 2),
        _small("gdn.conv_update", n, B * sum(m.nbytes for m in conv) / tp * 2),
        OpSpec(
            "gdn.recurrent_update",
            "gdn",
            n,
            kv_bytes=2 * B * layer.state_bytes / tp,
            shape=GdnShape(batch=B, state_bytes=layer.state_bytes / tp),
            kernels=1,
        ),
        _small("gdn.gated_norm", n, B * h * 4),
        _gemm("gdn.out_proj", n, out, 1 / tp, B, h, out[0].cols / tp if out else h),
    ]
    return ops


def _moe_ops(s: Setup, kinds: Kinds, n: int, B: float) -> list[OpSpec]:
    spec, d = s.spec, s.dep
    h = spec.hidden
    ops: list[OpSpec] = []
    router = kinds.get("router", [])
    if router:
        ops.append(_gemm("moe.router", n, router, 1.0, B, router[0].rows, h))
    ops.append(_small("moe.topk", n, B * spec.n_experts * 4))
    experts = kinds.get("expert", [])
    tokens = B * (d.dp if d.ep > 1 else 1)
    distinct = expected_distinct(spec.n_experts, spec.top_k, tokens)
    busiest = expected_max_load(spec.n_experts, distinct, d.ep) if d.ep > 1 else distinct
    per_expert = sum(m.nbytes / m.count for m in experts)
    inter = spec.moe_intermediate
    fmt, comp = _fmt_of(experts)
    ops.append(
        OpSpec(
            "moe.experts",
            "moe",
            n,
            weight_bytes=busiest * per_expert / s.expert_tp,
            flops=2.0 * tokens * spec.top_k * 3 * h * inter / s.expert_tp / max(d.ep, 1),
            fmt=fmt,
            compute=comp,
            kernels=5,
            shape=MoeShape(
                tokens=tokens,
                hidden=h,
                inter=inter,
                experts=spec.n_experts,
                topk=spec.top_k,
                moe_tp=s.expert_tp,
                ep=d.ep,
                busiest_experts=busiest,
                expert_bytes=per_expert / s.expert_tp,
            ),
        )
    )
    shared = kinds.get("shared", [])
    if shared:
        tp = d.tp
        gate_up = [m for m in shared if not m.name.endswith("down_proj")]
        down = [m for m in shared if m.name.endswith("down_proj")]
        si = gate_up[0].rows if gate_up else 0
        ops.append(_gemm("moe.shared.gate_up", n, gate_up, 1 / tp, B, 2 * si / tp, h))
        ops.append(_small("moe.shared.act", n, B * 3 * si / tp * 2))
        ops.append(_gemm("moe.shared.down", n, down, 1 / tp, B, h, si / tp))
        # Qwen2-MoE/Qwen3-Next/Qwen3.5 scale the shared expert by sigmoid(shared_expert_gate(x)):
        # one more (hidden -> 1) GEMM in the shared branch, on its stream where it has one
        gate = kinds.get("shared_gate", [])
        if gate:
            ops.append(_gemm("moe.shared.gate", n, gate, 1.0, B, 1, h))
    return ops


def _comm_ops(s: Setup, B: float) -> list[OpSpec]:
    """Collectives of one step (count and bytes; the latency comes from evidence.comm)."""
    spec, d = s.spec, s.dep
    act = B * spec.hidden * 2  # bf16 activations
    ops: list[OpSpec] = []
    if d.tp > 1:
        ops.append(
            OpSpec(
                "allreduce",
                "comm",
                2 * spec.num_layers + 1,
                act_bytes=act,
                shape=CommShape(collective="allreduce", bytes=act, ranks=d.tp),
            )
        )
        logits = B * spec.vocab / d.tp * 2
        ops.append(
            OpSpec(
                "logits.gather",
                "comm",
                1,
                act_bytes=logits,
                shape=CommShape(collective="gather", bytes=logits, ranks=d.tp),
            )
        )
        ops += _model_collectives(s, B)
    if d.ep > 1 and d.dp > 1:
        per_rank = B * spec.top_k * spec.hidden * 2
        ops.append(
            OpSpec(
                "alltoall.dispatch_combine",
                "comm",
                2 * spec.moe_layers,
                act_bytes=per_rank,
                shape=CommShape(collective="alltoall", bytes=per_rank, ranks=d.ep),
            )
        )
    if d.pp > 1:
        ops.append(
            OpSpec(
                "pp.send",
                "comm",
                d.pp - 1,
                act_bytes=act,
                shape=CommShape(collective="send", bytes=act, ranks=2),
            )
        )
    return ops


def _model_collectives(s: Setup, B: float) -> list[OpSpec]:
    """Collectives a model's implementation adds under TP (kernels.yaml
    ``tp_layer_collectives``: MiniMax-M2's full-width QK norm allreduces its sums of squares in
    every attention layer, in vLLM and SGLang alike)."""
    rule = kernels().tp_layer_collectives.get(s.spec.architecture)
    if rule is None:
        return []
    layers = sum(1 for layer in s.spec.layers if layer.attention != "linear")
    nbytes = B * rule.bytes_per_token
    out = [
        OpSpec(
            rule.name,
            "comm",
            layers * rule.per_layer,
            act_bytes=nbytes,
            shape=CommShape(collective="allreduce", bytes=nbytes, ranks=s.dep.tp),
        )
    ]
    if rule.kernels:
        out.append(_small(rule.name + ".norm", layers, 0.0, rule.kernels))
    return out
