"""One analytic prediction on GPUs: resolve the setup, run the decode step, assemble it.

:func:`predict_one` is the computation behind :func:`ceiling.predict.api.predict` (which adds
the what-if table) and behind every what-if variant (:func:`variant`): keeping it apart from
both is what lets ``whatif`` call it without importing ``api``.
"""

from __future__ import annotations

from ceiling.errors import CeilingError
from ceiling.predict import tables
from ceiling.predict.choices import check_backends, host_cost
from ceiling.predict.datafiles import constants
from ceiling.predict.interval import attach
from ceiling.predict.schema import (
    BatchPoint,
    DeploymentUsed,
    EvidenceSummary,
    HardwareUsed,
    ModelSummary,
    OpRecord,
    Prediction,
    PredictRequest,
    StepBlock,
)
from ceiling.predict.specdec import assumption as spec_assumption
from ceiling.predict.specdec import spec_step
from ceiling.predict.step import (
    GiB,
    Setup,
    Step,
    achieved_bw,
    decode_step,
    kv_bytes_per_token_gpu,
    prefill_ms,
    weight_resident_bytes,
)
from ceiling.predict.validate import check_dcp, check_engine_vendor
from ceiling.spec.checks import check_parallel
from ceiling.spec.deployment import Deployment, engine_rules, engines_table
from ceiling.spec.hardware import GPU, list_links, load_gpu, load_link
from ceiling.spec.model import ModelSpec, load_model
from ceiling.spec.profile import load_profile
from ceiling.spec.quant import named_format

_MODELS: dict[tuple[str, str], ModelSpec] = {}


def load_spec(name: str, weight_format: str | None = None) -> ModelSpec:
    """The ModelSpec of a catalog name or local config (loaded once per process), optionally
    with every linear layer in another format."""
    key = (name, weight_format or "native")
    if key not in _MODELS:
        fmt = named_format(weight_format) if weight_format else None
        _MODELS[key] = load_model(name, fmt)
    return _MODELS[key]


def summary_of(spec: ModelSpec) -> ModelSummary:
    return ModelSummary(
        name=spec.name,
        architecture=spec.architecture,
        attention=spec.attention,
        layers=spec.num_layers,
        hidden_size=spec.hidden,
        total_params_B=round(spec.total_params() / 1e9, 2),
        active_params_B=round(spec.active_params() / 1e9, 2),
        weight_GB=round(spec.weight_bytes() / 1e9, 2),
        weight_bytes=spec.weight_bytes(),
        quantization=spec.quant.summary,
        experts=spec.n_experts,
        top_k=spec.top_k,
    )


def setup(req: PredictRequest, spec: ModelSpec | None = None) -> tuple[Setup, int]:
    """(everything resolved for the request, GPUs in total); CeilingError for a layout the
    engines refuse or a name the catalog does not know."""
    if spec is None:
        spec = load_spec(req.model, req.weight_format)
    check_parallel(spec, req.tp, req.pp)  # what engines refuse is refused, not predicted
    gpu = load_gpu(req.gpu_name())
    check_engine_vendor(req.engine, gpu)  # a what-if "other engine" row says it cannot run
    if req.power_limit is not None or req.mem_clock is not None:
        gpu = gpu.with_limits(req.power_limit, req.mem_clock)
    per_replica = req.tp * req.pp
    gpus = req.gpus or per_replica * (req.dp or 1)
    if gpus < per_replica:
        raise CeilingError(
            f"tp x pp = {per_replica} needs {per_replica} GPUs, but --gpus is {gpus}",
            fix=f"use --gpus {per_replica} (or more, as data-parallel replicas), or a smaller --tp",
        )
    if gpus % per_replica:
        raise CeilingError(
            f"--gpus {gpus} is not a multiple of tp x pp = {per_replica}",
            fix="use --gpus equal to tp x pp (x dp replicas)",
        )
    dp = req.dp or gpus // per_replica
    if req.dp and req.dp * per_replica != gpus:
        raise CeilingError(
            f"tp x pp x dp = {req.dp * per_replica} but --gpus is {gpus}",
            fix="make --gpus equal to tp x pp x dp (or leave one of them out)",
        )
    if req.ep > 1:
        if not spec.is_moe:
            raise CeilingError(f"--ep {req.ep} on a dense model ({spec.name})", fix="drop --ep")
        if req.ep > req.tp * dp or (req.tp * dp) % req.ep:
            raise CeilingError(
                f"--ep {req.ep} must divide tp x dp = {req.tp * dp}",
                fix="EP reuses the TP (and DP) ranks: e.g. --tp 8 --ep 8",
            )
        if spec.n_experts % req.ep:
            raise CeilingError(
                f"{spec.n_experts} experts do not split over --ep {req.ep}",
                fix=f"use an --ep that divides {spec.n_experts}",
            )
    check_dcp(req.engine, req.dcp, req.tp, spec)
    default_link = _default_link(gpu, req.tp * req.pp)
    talks = req.tp * req.pp > 1 or (req.ep > 1 and dp > 1)
    asked = req.link_name()
    if asked is None or (not talks and asked in ("self", "none", "")):
        link = load_link(default_link)
    else:
        load_link(asked)  # an unknown name is an error, used or not
        # one GPU per replica: the link is never used
        link = load_link(asked if talks else default_link)
    dep = Deployment(
        engine=req.engine,
        tp=req.tp,
        pp=req.pp,
        ep=req.ep,
        dp=dp,
        dcp=req.dcp,
        kv_dtype=req.kv_dtype,
        cuda_graphs=req.cuda_graphs,
        allreduce=req.allreduce,
    )
    rules = engine_rules(req.engine)
    consts = constants()
    profile = load_profile(req.profile) if req.profile else None
    impl, reason = dep.resolve_allreduce(link)
    kvb, kv_reason = dep.kv_elem_bytes(spec.quant.kv_cache_dtype)
    kvb, kv_reason = _engine_kv_default(req.engine, dep.kv_dtype, spec, gpu, kvb, kv_reason)
    bw, bw_reason = achieved_bw(gpu, consts, profile)
    s = Setup(
        spec, gpu, link, dep, rules, consts, profile, impl, reason, kvb, kv_reason, bw, bw_reason
    )
    check_backends(req.engine, req.attention_backend, req.moe_backend)
    s.attention_backend, s.moe_backend = req.attention_backend, req.moe_backend
    s.async_scheduling = req.async_scheduling
    return s, gpus


def _engine_kv_default(
    engine: str, asked: str, spec: ModelSpec, gpu: GPU, kvb: float, why: str
) -> tuple[float, str]:
    """The engine's own KV dtype for ``--kv-dtype auto`` where it departs from the model
    dtype: SGLang's fp8 cache for DeepSeek sparse attention from SM100 (engines.yaml dsa)."""
    entry = engines_table().get(engine)
    dsa = entry.dsa if entry is not None else None
    if asked != "auto" or dsa is None or "index_topk" not in spec.mla:
        return kvb, why
    if gpu.sm < dsa.kv_fp8_from_sm:
        return kvb, why
    return 1.0, f"kv cache fp8_e4m3 ({engine} picks it for DeepSeek sparse attention on SM{gpu.sm})"


def _default_link(gpu: GPU, world: int) -> str:
    """The link a box of these GPUs has unless told: NVLink (a 2-way bridge only joins pairs),
    else PCIe behind switches, without P2P where the driver refuses it (GeForce)."""
    names = {lk.name for lk in list_links()}
    if gpu.nvlink and not (gpu.nvlink.endswith("-bridge") and world > 2):
        return gpu.nvlink
    if not gpu.p2p_supported:
        for name in (f"pcie{gpu.pcie_gen}-nop2p", f"pcie{gpu.pcie_gen}-switch-nop2p"):
            if name in names:
                return name
    return f"pcie{gpu.pcie_gen}-switch"


def _memory(s: Setup, batch: int, context: int) -> dict[str, float]:
    w = weight_resident_bytes(s)
    kv_tok, state = kv_bytes_per_token_gpu(s, context)
    kv_tok /= s.dep.pp
    state /= s.dep.pp
    usable = (
        s.gpu.memory_bytes * s.rules.gpu_memory_utilization - s.rules.activation_reserve_GiB * GiB
    )
    kv_need = batch * (context * kv_tok + state)
    free = usable - w
    per_seq = context * kv_tok + state
    return {
        "weights": w / GiB,
        "kv": kv_need / GiB,
        "usable": usable / GiB,
        "total": s.gpu.memory_bytes / GiB,
        "_kv_tok": kv_tok,
        "_free": free,
        "_per_seq": per_seq,
    }


def _kinds(s: Setup) -> dict[str, str]:
    link_fix = (
        "configurable (one-shot allreduce available)"
        if s.allreduce_impl == "nccl" and s.link.oneshot is not None
        else "fundamental (link latency x layers)"
    )
    return {
        "weights": "fundamental (bandwidth x weight format)",
        "kv": "fundamental (context x KV dtype)",
        "collectives": link_fix if s.dep.tp > 1 or s.dep.pp > 1 or s.dep.ep > 1 else "none",
        "launch": "configurable (enable CUDA graphs)"
        if not s.dep.cuda_graphs
        else "configurable (kernel fixed costs and inefficiency vs the best known kernels: "
        "the gap to the bound)",
        "host": "configurable (engine overhead, async scheduling)",
        "compute": "fundamental (tensor-core peak)",
    }


def _curve(s: Setup, context: int, max_batch: int) -> list[BatchPoint]:
    b, top = 1, max(1, min(max_batch, 1024))
    sizes = []
    while b <= top:
        sizes.append(b)
        b *= 2
    if top not in sizes:
        sizes.append(top)
    points = []
    for bb in sizes:
        st = decode_step(s, bb, context)
        points.append(
            BatchPoint(
                batch=bb,
                step_ms=round(st.ms, 4),
                tok_s_per_stream=round(1e3 / st.ms, 2),
                aggregate_tok_s=round(bb * s.dep.dp * 1e3 / st.ms, 1),
            )
        )
    return points


def predict_one(
    req: PredictRequest, spec: ModelSpec | None = None, curve: bool = True, strict: bool = True
) -> Prediction:
    """One prediction; ``strict`` raises when weights + KV do not fit (what-ifs report it)."""
    s, gpus = setup(req, spec)
    mem = _memory(s, req.batch, req.context)
    if mem["_free"] <= 0:
        raise CeilingError(
            f"{s.spec.name} does not fit: {mem['weights']:.1f} GiB of weights per GPU vs "
            f"{mem['usable']:.1f} GiB usable on {s.gpu.name} (tp={s.dep.tp}, pp={s.dep.pp}, ep={s.dep.ep})",
            fix="use more GPUs (--tp/--pp), a smaller weight format (--weight-format), or a larger GPU",
        )
    capacity = int(mem["_free"] / mem["_kv_tok"]) if mem["_kv_tok"] > 0 else 10**9
    max_batch = int(mem["_free"] / mem["_per_seq"]) if mem["_per_seq"] > 0 else 10**6
    fits = mem["weights"] + mem["kv"] <= mem["usable"]
    if not fits and strict:
        raise CeilingError(
            f"KV cache does not fit: batch {req.batch} x context {req.context} needs "
            f"{mem['kv']:.1f} GiB per GPU, {mem['usable'] - mem['weights']:.1f} GiB left after "
            f"{mem['weights']:.1f} GiB of weights (max batch at this context: {max_batch})",
            fix=f"use --batch {max(max_batch, 1)} or less, a shorter --context, --kv-dtype fp8, "
            "or more GPUs",
        )
    step = spec_step(s, req) if req.spec != "none" else decode_step(s, req.batch, req.context)
    ms = step.ms
    per_stream = 1e3 / ms
    pre = prefill_ms(s, req.prompt_len) if curve else {}
    expected_block, bound_block = _blocks(step)
    comps = {k: round(v, 4) for k, v in step.components.items()}
    pred = Prediction(
        request=req,
        model=summary_of(s.spec),
        hardware=HardwareUsed(
            gpu=s.gpu.name,
            gpus=gpus,
            link=s.link.name,
            p2p=s.link.p2p,
            bw_GBps_achieved=round(s.bw_GBps, 1),
            memory_GiB=s.gpu.memory_GiB,
        ),
        deployment=DeploymentUsed(**s.dep.model_dump(), allreduce_impl=s.allreduce_impl),
        batch=req.batch,
        context=req.context,
        decode_ms_per_token=round(ms, 4),
        decode_tok_s_per_stream=round(per_stream, 2),
        aggregate_tok_s=round(req.batch * s.dep.dp * per_stream, 2),
        components_ms=comps,
        component_share={k: round(v / ms, 4) for k, v in step.components.items()},
        component_kind={k: v for k, v in _kinds(s).items() if k in comps},
        fits_in_memory=fits,
        memory_GiB_per_gpu={k: round(v, 2) for k, v in mem.items() if not k.startswith("_")},
        kv_capacity_tokens=capacity,
        max_batch_at_context=max_batch,
        batch_curve=_curve(s, req.context, max_batch) if curve else [],
        prefill={**{k: round(v, 3) for k, v in pre.items()}, "prompt_len": req.prompt_len}
        if pre
        else {},
        details=step.details,
        assumptions=_assumptions(s, req, gpus, step),
        expected=expected_block,
        bound=bound_block,
        evidence=_evidence_summary(step),
    )
    return attach(pred)  # the 80 % interval on expected and the batch curve


def _blocks(step: Step) -> tuple[StepBlock, StepBlock]:
    def block(ms: float, comps: dict[str, float], attr: str) -> StepBlock:
        ops = []
        for r in step.ops:
            v = getattr(r, attr)
            if v <= 0 and r.kind != "host" and not (attr == "expected_ms" and r.hidden_ms > 0):
                continue  # (a fully hidden op stays in the expected table: its note says why)
            ops.append(
                OpRecord(
                    name=r.name,
                    count=r.count,
                    ms=round(v, 4),
                    source="physics" if attr == "bound_ms" else r.source,
                    confidence=round(r.confidence, 2) if attr == "expected_ms" else 1.0,
                    kernel=r.family,
                    note=r.note if attr == "expected_ms" else "",
                )
            )
        return StepBlock(
            decode_ms_per_token=round(ms, 4),
            decode_tok_s_per_stream=round(1e3 / ms, 2) if ms > 0 else 0.0,
            components_ms={k: round(v, 4) for k, v in comps.items()},
            ops=ops,
        )

    return (
        block(step.ms, step.components, "expected_ms"),
        block(step.bound_ms, step.bound_components, "bound_ms"),
    )


def _evidence_summary(step: Step) -> EvidenceSummary:
    ti = tables.info()
    by_source: dict[str, float] = {}
    for r in step.ops:
        by_source[r.source] = by_source.get(r.source, 0.0) + r.expected_ms
    total = sum(by_source.values()) or 1.0
    return EvidenceSummary(
        tables=(
            f"aiconfigurator-core {ti.version}"
            + ("" if ti.pinned else f" (pinned {tables.PINNED})")
        )
        if ti
        else "not installed (pip install 'ceiling[tables]'): priors",
        share_of_expected_by_source={k: round(v / total, 3) for k, v in by_source.items()},
        low_confidence_ops=[
            r.name for r in step.ops if r.confidence < 0.45 and r.expected_ms > 0.02 * total
        ],
    )


def _assumptions(s: Setup, req: PredictRequest, gpus: int, step: Step) -> list[str]:
    spec, d = s.spec, s.dep
    out = [
        f"model {spec.name}: {spec.architecture}, {spec.num_layers} layers, {spec.attention} attention, "
        f"{spec.total_params() / 1e9:.1f}B params ({spec.active_params() / 1e9:.1f}B active)",
        f"weights: {spec.quant.summary}; "
        + ", ".join(
            f"{k} {v / 1e9:.1f} GB"
            for k, v in sorted(spec.formats().items(), key=lambda kv: -kv[1])
        ),
        s.bw_reason,
        s.kv_reason,
        f"allreduce: {s.allreduce_impl} ({s.allreduce_reason})",
        f"layout: {gpus} x {s.gpu.name} over {s.link.name}; tp={d.tp} pp={d.pp} ep={d.ep} dp={d.dp}"
        + (
            f" dcp={d.dcp} (MLA latent KV sharded by token over {d.dcp} TP ranks; query and LSE "
            "all-gathered, output reduce-scattered per MLA layer: vLLM ag_rs)"
            if d.dcp > 1
            else ""
        ),
        f"kernels/step: {step.details.kernels_per_step} ({step.details.gemm_kernels_per_step} GEMMs "
        f"x {s.gemm_kernel_us:.2f} us fixed + others x {s.small_kernel_us:.2f} us in a CUDA graph)"
        + (
            ""
            if d.cuda_graphs
            else f"; CUDA graphs off: CPU issue {s.eager_kernel_us:.1f} us/kernel when slower than the GPU"
        ),
        "host overhead {:.2f} ms/step ({})".format(*host_cost(s)),
        f"decode at context {req.context} tokens; batch {req.batch}; activations bf16",
    ]
    if spec.is_moe:
        out.append(
            f"MoE: {spec.n_experts} experts top-{spec.top_k}; reads expected distinct experts "
            f"E(1-(1-k/E)^B) = {step.details.expected_distinct_experts} per MoE layer"
            + (
                f", busiest of {d.ep} EP ranks"
                if d.ep > 1
                else f", each split {s.expert_tp} ways by TP"
            )
        )
    stream = step.details.shared_expert_stream
    if stream:
        out.append(
            f"shared expert on a second CUDA stream: {stream.hidden_ms:.2f} ms/step of its "
            f"fixed costs hidden behind the router and routed experts ({stream.rule})"
        )
    if spec.attention == "mla":
        out.append(
            "MLA latent KV (kv_lora_rank + rope dim) replicated on every TP rank; q_a/kv_a projections replicated"
        )
    if spec.attention == "hybrid":
        out.append(
            "linear-attention layers: recurrent state read and written each step, no per-token KV"
        )
    sd = spec_assumption(step)
    if sd:
        out.append(sd)
    if s.profile is not None:
        out.append(f"measured profile applied: {req.profile}")
        from_trace = sorted({r.name for r in step.ops if r.source == "trace"})
        if from_trace:
            out.append("ops timed by the engine's trace: " + ", ".join(from_trace))
        out.extend(step.details.trace_evidence or [])
    out.extend(spec.notes)
    return out


def variant(req: PredictRequest) -> tuple[Prediction | None, str]:
    """A what-if variant's prediction (no batch curve), or None and why it cannot run."""
    try:
        return predict_one(req, curve=False, strict=False), ""
    except CeilingError as err:
        return None, err.message
