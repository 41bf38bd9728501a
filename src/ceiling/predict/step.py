"""The decode step as a sum of named components, and the prefill estimate.

    T_step = weights + kv + collectives + launch + host (+ compute when the roofline says so)

- weights: bytes one GPU reads per step / achieved bandwidth. Dense and attention weights are
  split by TP (MLA's q_a/kv_a projections are replicated), routed experts read only the
  expected distinct experts for the batch, shared experts and lm_head every step, the
  embedding is a lookup. Pipeline stages run one after another, so a token pays every stage.
- kv: B x context x KV bytes/token of every full-attention layer (sliding layers cap at the
  window, MLA's latent cache is replicated on every TP rank, GQA KV heads split by TP down to
  one per rank) + recurrent state read and write of linear-attention layers.
- collectives: 2 allreduces per layer under TP (+ embedding and logits), all-to-all under EP
  with DP attention, sends under PP.
- launch: kernels per step x per-kernel cost in a CUDA graph; eagerly, the CPU launch time
  when it exceeds the GPU time.
- host: the engine's per-step CPU work that is not overlapped.
- compute: max(0, FLOPs / (peak x efficiency) - memory time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ceiling.predict import trace_evidence
from ceiling.predict.collectives import allreduce_us, alltoall_us, send_us
from ceiling.predict.datafiles import Constants, KernelCount
from ceiling.predict.moe import expected_distinct, expected_max_load
from ceiling.predict.ops import build_ops
from ceiling.predict.opspec import CommShape, OpRow, OpSpec
from ceiling.predict.overlap import clamp_bound, hide, shared_stream_rule, take_from
from ceiling.predict.resolved import Setup
from ceiling.predict.schema import SharedExpertStream, StepDetails
from ceiling.spec.hardware import GPU
from ceiling.spec.model import ModelSpec
from ceiling.spec.profile import HardwareProfile

__all__ = ["GiB", "Setup", "Step"]  # Setup: re-exported for readers of the step model

GiB = 2**30


@dataclass
class Step:
    """One decode step: expected components (ms), bound components, the ops, the facts."""

    components: dict[str, float]
    details: StepDetails
    bound_components: dict[str, float] = field(default_factory=dict)
    ops: list[OpRow] = field(default_factory=list)

    @property
    def ms(self) -> float:
        return sum(self.components.values())

    @property
    def bound_ms(self) -> float:
        return sum(self.bound_components.values())


def achieved_bw(gpu: GPU, consts: Constants, profile: HardwareProfile | None) -> tuple[float, str]:
    """Achieved weight-read bandwidth (GB/s) and where the number comes from."""
    if profile is not None:
        if profile.gemv_bw_GBps:
            # bf16 GEMV is the reference weight-read path: calibrate's int8/fp8 figures come
            # from torch's generic kernels (_int_mm, _scaled_mm), not the engines' quantized
            # kernels (Marlin, CUTLASS), so they say little about an engine's INT4/FP8 reads.
            dtype = (
                "bf16"
                if "bf16" in profile.gemv_bw_GBps
                else max(profile.gemv_bw_GBps, key=profile.gemv_bw_GBps.__getitem__)
            )
            bw = profile.gemv_bw_GBps[dtype]
            return bw, f"weight-read bandwidth {bw:.0f} GB/s (measured {dtype} GEMV, profile)"
        if profile.mem_bw_GBps:
            return (
                profile.mem_bw_GBps,
                f"weight-read bandwidth {profile.mem_bw_GBps:.0f} GB/s (measured, profile)",
            )
    if gpu.measured_bw_GBps:
        return (
            gpu.measured_bw_GBps,
            f"weight-read bandwidth {gpu.measured_bw_GBps:.0f} GB/s (measured on this GPU model, catalog)",
        )
    eff = consts.bw_efficiency
    bw = gpu.mem_bw_GBps * eff
    return (
        bw,
        f"weight-read bandwidth {bw:.0f} GB/s = datasheet {gpu.mem_bw_GBps:.0f} x efficiency {eff}",
    )


# ----------------------------------------------------------------------------- bytes per GPU


def weight_read_bytes(s: Setup, tokens: float) -> tuple[float, dict[str, float]]:
    """Weight bytes one GPU reads in a step that processes ``tokens`` tokens per replica."""
    spec, d = s.spec, s.dep
    by_kind: dict[str, float] = {}
    # Tokens the experts see: with DP attention + EP, the MoE layers serve every DP rank's batch.
    moe_tokens = tokens * (d.dp if d.ep > 1 else 1)
    distinct = expected_distinct(spec.n_experts, spec.top_k, moe_tokens)
    # EP: the step waits for the EP rank holding the most touched experts.
    busiest = expected_max_load(spec.n_experts, distinct, d.ep) if d.ep > 1 else distinct
    for m in spec.modules:
        if m.kind == "embed":
            b = tokens * m.nbytes / max(m.rows, 1)  # a lookup: one row per token
        elif m.kind == "expert":
            b = m.nbytes / m.count * busiest / s.expert_tp
        elif m.shard == "tp":
            b = m.nbytes / d.tp
        else:
            b = m.nbytes
        by_kind[m.kind] = by_kind.get(m.kind, 0.0) + b
    return sum(by_kind.values()), by_kind


def weight_resident_bytes(s: Setup) -> float:
    """Weight bytes stored on one GPU (memory fit), after TP/EP/PP sharding."""
    spec, d = s.spec, s.dep
    total = 0.0
    for m in spec.modules:
        if m.kind == "expert":
            total += m.nbytes / (d.ep if d.ep > 1 else 1) / s.expert_tp
        elif m.shard == "tp":
            total += m.nbytes / d.tp
        else:
            total += m.nbytes
    return total / d.pp


def kv_bytes_per_token_gpu(s: Setup, context: int) -> tuple[float, float]:
    """(KV bytes per token of context on one GPU, recurrent-state bytes per sequence on one GPU).

    Summed over every layer (all PP stages: what one token's decode reads end to end).
    """
    d = s.dep
    per_tok = 0.0
    state = 0.0
    for layer in s.spec.layers:
        if layer.attention == "linear":
            state += layer.state_bytes / d.tp
            continue
        if layer.attention == "mla":
            # latent cache replicated on every TP rank; DCP shards it by token over its group
            share = 1.0 / d.dcp
        else:
            heads_per_rank = max(1, math.ceil(layer.kv_heads / d.tp))
            # DCP shards the replicas of a KV head (TP above the KV heads) by token
            share = heads_per_rank / layer.kv_heads / d.dcp
        frac = 1.0
        if layer.window and context > layer.window:
            frac = layer.window / context
        per_tok += layer.kv_bytes_per_token * s.kv_bytes * share * frac
    return per_tok, state


# ----------------------------------------------------------------------------- kernels


# GEMM groups per block that need their input activations quantized first (w8a8 / w4a4
# formats): attention qkv + o, linear attention's input + out (its gate projection apart),
# dense gate_up + down, one for the routed experts' input, shared expert gate_up + down.
_ACT_QUANT_GROUPS = {
    "attn": 2,
    "attn_replicated": 0,
    "linear_attn": 2,
    "linear_attn_gate": 1,
    "mlp": 2,
    "expert": 1,
    "shared": 2,
}


def _act_quant_groups(spec: ModelSpec) -> int:
    """Activation-quantization kernels per step: one per GEMM group stored fp8/fp4."""
    seen: set[tuple[int | None, str]] = set()
    for m in spec.modules:
        if m.linear and m.fmt.compute in ("fp8", "fp4") and m.kind in _ACT_QUANT_GROUPS:
            seen.add((m.layer, m.kind))
    return sum(_ACT_QUANT_GROUPS[kind] for _, kind in seen)


def kernels_per_step(s: Setup) -> tuple[int, int]:
    """(GEMM kernels, other kernels) of one decode step; collectives have their own component."""
    table = s.consts.kernels[s.rules.kernels]
    counts = {"gemm": 0, "other": 0}

    def add(block: str, times: int = 1) -> None:
        k: KernelCount = table.block(block)
        counts["gemm"] += k.gemm * times
        counts["other"] += k.other * times

    add("per_step")
    for layer in s.spec.layers:
        add(
            "attn_mla"
            if layer.attention == "mla"
            else "attn_linear"
            if layer.attention == "linear"
            else "attn_gqa"
        )
        if layer.mlp == "moe":
            add("moe")
            if s.spec.n_shared:
                add("shared_expert")
        else:
            add("mlp_dense")
    add("act_quant", _act_quant_groups(s.spec))
    return counts["gemm"], counts["other"]


def collectives_per_step(s: Setup, tokens: float) -> tuple[float, dict[str, str | int | float]]:
    """Milliseconds of collectives in one decode step, and what they are."""
    spec, d, link = s.spec, s.dep, s.link
    act_bytes = tokens * spec.hidden * 2  # bf16 activations
    info: dict[str, str | int | float] = {"allreduce_impl": s.allreduce_impl}
    total_us = 0.0
    if d.tp > 1:
        n_ar = 2 * spec.num_layers + 2  # attention + MLP per layer, embedding, logits gather
        impl = s.allreduce_impl
        if impl == "oneshot" and act_bytes > s.rules.custom_ar_max_bytes:
            impl = "nccl"  # engines fall back to NCCL above their custom-allreduce buffer
            info["allreduce_impl"] = "nccl (message above the custom-allreduce buffer)"
        one = allreduce_us(link, impl, d.tp, act_bytes, s.profile, in_cuda_graph=d.cuda_graphs)
        total_us += n_ar * one
        info.update(allreduces=n_ar, allreduce_bytes=int(act_bytes), allreduce_us=round(one, 2))
    if d.ep > 1 and d.dp > 1:
        # DP attention + EP: dispatch and combine per MoE layer; bf16 activations, k copies.
        per_rank = tokens * spec.top_k * spec.hidden * 2
        one = alltoall_us(link, d.ep, per_rank)
        n_a2a = 2 * spec.moe_layers
        total_us += n_a2a * one
        info.update(alltoalls=n_a2a, alltoall_us=round(one, 2))
    if d.pp > 1:
        one = send_us(link, act_bytes)
        total_us += (d.pp - 1) * one
        info.update(pp_sends=d.pp - 1, send_us=round(one, 2))
    return total_us / 1e3, info


# ----------------------------------------------------------------------------- FLOPs


def _compute_dtype(spec: ModelSpec) -> str:
    weights: dict[str, float] = {}
    for m in spec.modules:
        if m.linear:
            weights[m.fmt.compute] = weights.get(m.fmt.compute, 0) + m.nbytes
    return max(weights, key=lambda k: weights[k]) if weights else "bf16"


def flops_per_gpu(s: Setup, tokens: float, context: float, causal_prefill: bool = False) -> float:
    """FLOPs one GPU does for ``tokens`` new tokens at ``context`` tokens of history."""
    spec, d = s.spec, s.dep
    active = spec.active_params() - sum(m.params for m in spec.modules if m.kind == "lm_head")
    lm = spec.vocab * spec.hidden
    linear = 2 * tokens * (active / (d.tp * d.pp) + lm / d.tp)
    attn = 0.0
    ctx = context / 2 if causal_prefill else context
    for layer in spec.layers:
        if layer.attention == "linear":
            continue
        if layer.attention == "mla":
            dims = spec.mla["kv_lora_rank"] * 2 + spec.mla["qk_rope_head_dim"]
        else:
            dims = 2 * spec.head_dim
        eff_ctx = min(ctx, layer.window) if layer.window else ctx
        attn += 2 * tokens * eff_ctx * (spec.heads / d.tp) * dims
    return linear + attn / d.pp


# ----------------------------------------------------------------------------- the step


def _split(row: OpRow, op: OpSpec, bw_ref: float, consts: Constants, gpu: GPU) -> dict[str, float]:
    """Components of one op's time: roofline parts at the reference bandwidth, the rest launch."""
    if row.kind == "comm":
        return {"collectives": row.expected_ms}
    if row.kind == "host":
        return {"host": row.expected_ms}
    w = row.count * op.weight_bytes / (bw_ref * 1e9) * 1e3
    kv = row.count * op.kv_bytes / (bw_ref * 1e9) * 1e3
    mem = w + kv
    comp_peak = gpu.peak_tflops(op.compute) * 1e12 * consts.compute_efficiency
    cmp = row.count * op.flops / comp_peak * 1e3 if op.flops else 0.0
    total = row.expected_ms
    out: dict[str, float] = {}
    if mem + max(cmp - mem, 0.0) > total and mem > 0:  # faster than the reference: scale
        scale = total / (mem + max(cmp - mem, 0.0))
        w, kv, cmp = w * scale, kv * scale, cmp * scale
        mem = w + kv
    out["weights"] = w
    out["kv"] = kv
    if cmp > mem:
        out["compute"] = cmp - mem
    out["launch"] = max(total - w - kv - out.get("compute", 0.0), 0.0)
    return out


def decode_step(s: Setup, batch: int, context: int, graphs: bool | None = None) -> Step:
    """Decode step of one replica at ``batch`` sequences of ``context``: expected and bound."""
    from ceiling.predict.evidence import Evidence

    graphs = s.dep.cuda_graphs if graphs is None else graphs
    ops = build_ops(s, batch, context)
    # each op at one sequence: where a table is judged, once for the whole curve (evidence.py)
    anchors = {op.name: op for op in (ops if batch == 1 else build_ops(s, 1, context))}
    ev = Evidence(s, anchors)
    rows: list[OpRow] = []
    comps = {k: 0.0 for k in ("weights", "kv", "collectives", "launch", "host")}
    bcomps = {k: 0.0 for k in ("weights", "kv", "collectives", "launch", "host")}
    bw_bound = ev.bound_bw()
    n_kernels = 0
    coll_calls = 0.0
    times, trace_notes = trace_evidence.apply(s, ops, [ev.time(op) for op in ops], batch, context)
    for op, t in zip(ops, times, strict=True):
        row = OpRow(
            op.name,
            op.kind,
            op.count,
            op.count * t.expected_us / 1e3,
            op.count * t.bound_us / 1e3,
            t.source,
            t.confidence,
            t.family,
            t.note,
            op.weight_bytes,
            op.kv_bytes,
        )
        rows.append(row)
        for k, v in _split(row, op, s.bw_GBps, s.consts, s.gpu).items():
            comps[k] = comps.get(k, 0.0) + v
        brow = OpRow(**{**row.__dict__, "expected_ms": row.bound_ms})
        for k, v in _split(brow, op, bw_bound, s.consts, s.gpu).items():
            bcomps[k] = bcomps.get(k, 0.0) + v
        if op.kind == "comm":
            coll_calls += op.count
        elif op.kind != "host":
            n_kernels += int(op.count * op.kernels)
    why = shared_stream_rule(s, batch)
    hidden = 0.0
    if why:  # the shared expert on a second stream: its fixed costs hide behind the main one
        share = s.consts.stream_overlap_share  # measured (constants.yaml)
        hidden = hide(rows, ops, "expected_ms", s.bw_GBps, share)
        take_from(comps, hidden)
        # the bound: the best engine's kernels could overlap fully
        take_from(bcomps, hide(rows, ops, "bound_ms", bw_bound) + clamp_bound(rows))
    if not graphs:
        # eager: the CPU issues every kernel and collective; the step is the slower of the two
        gpu_ms = sum(v for k, v in comps.items() if k != "host")
        cpu_ms = (n_kernels + coll_calls) * s.eager_kernel_us / 1e3
        comps["launch"] += max(0.0, cpu_ms - gpu_ms)
    comps = {k: v for k, v in comps.items() if v > 0 or k in ("weights", "kv", "launch", "host")}
    if s.dep.tp > 1 or s.dep.pp > 1 or s.dep.ep > 1:
        comps.setdefault("collectives", 0.0)
    bcomps = {k: v for k, v in bcomps.items() if v > 0 or k in ("weights", "kv")}
    w_bytes, w_by_kind = weight_read_bytes(s, float(batch))
    kv_tok, state = kv_bytes_per_token_gpu(s, context)
    kv_read = batch * (context * kv_tok + 2 * state)
    allreduces = sum(
        op.count
        for op in ops
        if isinstance(op.shape, CommShape) and op.shape.collective == "allreduce"
    )
    ar = next((r for r in rows if r.name == "allreduce"), None)
    details = StepDetails(
        weight_bytes_read_per_gpu=int(w_bytes),
        weight_bytes_read_by_kind={k: int(v) for k, v in sorted(w_by_kind.items())},
        kv_bytes_read_per_gpu=int(kv_read),
        kernels_per_step=n_kernels,
        gemm_kernels_per_step=int(sum(op.count for op in ops if op.kind in ("gemm", "moe"))),
        flops_per_gpu=flops_per_gpu(s, float(batch), context),
        allreduce_impl=s.allreduce_impl,
        collective_calls_per_step=int(coll_calls),
    )
    if allreduces:
        details.allreduces = int(allreduces)
        details.allreduce_bytes = int(batch * s.spec.hidden * 2)
        if ar is not None:
            details.allreduce_us = round(ar.expected_ms / ar.count * 1e3, 2)
    a2a = next((r for r in rows if r.name.startswith("alltoall")), None)
    if a2a is not None:
        details.alltoalls = int(a2a.count)
        details.alltoall_us = round(a2a.expected_ms / a2a.count * 1e3, 2)
    send = next((r for r in rows if r.name == "pp.send"), None)
    if send is not None:
        details.pp_sends = int(send.count)
        details.send_us = round(send.expected_ms / send.count * 1e3, 2)
    if trace_notes:
        details.trace_evidence = trace_notes
    if hidden > 0:
        details.shared_expert_stream = SharedExpertStream(hidden_ms=round(hidden, 4), rule=why)
    if s.spec.is_moe:
        moe_tokens = batch * (s.dep.dp if s.dep.ep > 1 else 1)
        details.expected_distinct_experts = round(
            expected_distinct(s.spec.n_experts, s.spec.top_k, moe_tokens), 2
        )
    return Step(comps, details, bound_components=bcomps, ops=rows)


def prefill_ms(s: Setup, prompt_len: int) -> dict[str, float]:
    """Prefill time of one prompt: chunked, each chunk max(compute, weight read) + collectives."""
    chunk = s.consts.prefill_chunk_tokens
    peak = s.gpu.peak_tflops(_compute_dtype(s.spec)) * 1e12 * s.consts.compute_efficiency
    total = 0.0
    done = 0
    n_k = kernels_per_step(s)
    while done < prompt_len:
        n = min(chunk, prompt_len - done)
        flops = flops_per_gpu(s, n, done + n / 2)
        w_bytes, _ = weight_read_bytes(s, n)
        t_mem = w_bytes / (s.bw_GBps * 1e9) * 1e3
        t_cmp = flops / peak * 1e3
        t_coll, _ = collectives_per_step(s, n)
        total += max(t_mem, t_cmp) + t_coll + s.kernel_ms(n_k)
        done += n
    from ceiling.predict.choices import host_cost

    return {"prefill_ms": total, "ttft_ms": total + host_cost(s)[0]}
