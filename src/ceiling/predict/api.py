"""``predict``: model + hardware + deployment -> the analytic decode ceiling, broken down.

The one public entry point is :func:`predict` (``PredictRequest`` in, ``Prediction`` out); the
CLI, ``doctor`` and the benchmarks all call it. Component names in ``components_ms`` are stable:
``weights``, ``kv``, ``collectives``, ``launch``, ``host`` and, when the roofline says so,
``compute``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ceiling.errors import CeilingError

SCHEMA_VERSION = 1

COMPONENTS = ("weights", "kv", "collectives", "launch", "host", "compute")


class PredictRequest(BaseModel):
    """What to predict. ``gpus`` defaults to tp x pp x dp; extra GPUs become DP replicas."""

    model: str
    gpu: str
    gpus: int | None = Field(None, ge=1)
    link: str | None = None
    tp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    dp: int | None = Field(None, ge=1)
    engine: Literal["vllm", "sglang", "trtllm", "generic"] = "vllm"
    allreduce: Literal["auto", "nccl", "oneshot"] = "auto"
    cuda_graphs: bool = True
    batch: int = Field(1, ge=1)
    context: int = Field(1024, ge=1, description="KV length per sequence during decode")
    prompt_len: int = Field(1024, ge=1)
    kv_dtype: str = "auto"
    weight_format: str | None = Field(None, description="override: bf16, fp8, nvfp4, int4-g32, ...")
    profile: str | None = None
    power_limit: float | None = Field(None, gt=0, description="board power cap, W")
    mem_clock: float | None = Field(None, gt=0, description="memory clock, MHz (nvidia-smi)")
    attention_backend: str | None = Field(None, description="engine's attention backend flag")
    moe_backend: str | None = Field(None, description="engine's MoE runner backend")
    async_scheduling: bool | None = Field(None, description="None: the engine's default")
    what_if: bool = False


class WhatIf(BaseModel):
    change: str
    decode_tok_s_per_stream: float = Field(description="expected, with this change")
    delta_pct: float = Field(description="expected tok/s change vs the request")
    decode_ms_per_token: float
    fits_in_memory: bool
    bound_tok_s_per_stream: float = Field(0.0, description="the bound with this change")
    moved: str = Field("", description="the component that moves most, 'name a -> b ms'")
    note: str = ""


class OpRecord(BaseModel):
    """One operation of the decode step (per GPU, per step)."""

    name: str
    count: float = Field(description="calls per step (per token at batch 1)")
    ms: float = Field(description="time per step, all calls")
    source: str = Field(description="table | profile | prior | engine (host estimate)")
    confidence: float = Field(description="0-1: how much the number is trusted")
    kernel: str = Field("", description="kernel family (data/predict/kernels.yaml)")
    note: str = ""


class StepBlock(BaseModel):
    """One figure of the decode step: ``expected`` or ``bound``."""

    decode_ms_per_token: float
    decode_tok_s_per_stream: float
    components_ms: dict[str, float]
    ops: list[OpRecord]


class BatchPoint(BaseModel):
    batch: int
    step_ms: float
    tok_s_per_stream: float
    aggregate_tok_s: float


class Prediction(BaseModel):
    schema_version: int = SCHEMA_VERSION
    request: dict[str, Any]
    model: dict[str, Any]
    hardware: dict[str, Any]
    deployment: dict[str, Any]
    batch: int
    context: int
    decode_ms_per_token: float
    decode_tok_s_per_stream: float
    aggregate_tok_s: float
    components_ms: dict[str, float]
    component_share: dict[str, float]
    component_kind: dict[str, str]
    fits_in_memory: bool
    memory_GiB_per_gpu: dict[str, float]
    kv_capacity_tokens: int
    max_batch_at_context: int
    batch_curve: list[BatchPoint]
    prefill: dict[str, float]
    details: dict[str, Any]
    assumptions: list[str]
    expected: StepBlock | None = Field(
        None, description="what this engine's default kernels deliver (= the top-level figures)"
    )
    bound: StepBlock | None = Field(
        None, description="the physical ceiling: best kernels, best collective, no host time"
    )
    evidence: dict[str, Any] = Field(
        default_factory=dict, description="which evidence was used (tables, profile, priors)"
    )
    what_if: list[WhatIf] = Field(default_factory=list)


# ----------------------------------------------------------------------------- setup

_MODELS: dict[tuple[str, str], Any] = {}


def _model(name: str, weight_format: str | None) -> Any:
    """Load (once per process) a ModelSpec, optionally with every linear in another format."""
    from ceiling.spec.model import load_model
    from ceiling.spec.quant import named_format

    key = (name, weight_format or "native")
    if key not in _MODELS:
        fmt = named_format(weight_format) if key[1] != "native" else None
        _MODELS[key] = load_model(name, fmt)
    return _MODELS[key]


def _setup(req: PredictRequest, spec: Any = None):  # -> (Setup, assumptions)
    from ceiling.predict.step import Setup, achieved_bw
    from ceiling.spec._data import load_yaml
    from ceiling.spec.checks import check_parallel
    from ceiling.spec.deployment import Deployment, engine_rules
    from ceiling.spec.hardware import load_gpu, load_link

    if spec is None:
        spec = _model(req.model, req.weight_format)
    check_parallel(spec, req.tp, req.pp)  # what engines refuse is refused, not predicted
    gpu = load_gpu(req.gpu)
    if req.power_limit is not None or req.mem_clock is not None:
        gpu = gpu.with_limits(req.power_limit, req.mem_clock)
    per_replica = req.tp * req.pp
    gpus = req.gpus or per_replica * (req.dp or 1)
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
    default_link = _default_link(gpu, req.tp * req.pp)
    talks = req.tp * req.pp > 1 or (req.ep > 1 and dp > 1)
    if req.link is None or (not talks and req.link in ("self", "none", "")):
        link = load_link(default_link)
    else:
        load_link(req.link)  # an unknown name is an error, used or not
        # one GPU per replica: the link is never used
        link = load_link(req.link if talks else default_link)
    dep = Deployment(
        engine=req.engine,
        tp=req.tp,
        pp=req.pp,
        ep=req.ep,
        dp=dp,
        kv_dtype=req.kv_dtype,
        cuda_graphs=req.cuda_graphs,
        allreduce=req.allreduce,
    )
    rules = engine_rules(req.engine)
    consts = load_yaml("predict/constants.yaml")
    profile = None
    if req.profile:
        from ceiling.spec.profile import load_profile

        profile = load_profile(req.profile)
    impl, reason = dep.resolve_allreduce(link)
    kvb, kv_reason = dep.kv_elem_bytes(spec.quant.kv_cache_dtype)
    bw, bw_reason = achieved_bw(gpu, consts, profile)
    s = Setup(
        spec, gpu, link, dep, rules, consts, profile, impl, reason, kvb, kv_reason, bw, bw_reason
    )
    from ceiling.predict.choices import check_backends

    check_backends(req.engine, req.attention_backend, req.moe_backend)
    s.attention_backend, s.moe_backend = req.attention_backend, req.moe_backend
    s.async_scheduling = req.async_scheduling
    return s, gpus


def _default_link(gpu: Any, world: int) -> str:
    """The link a box of these GPUs has unless told: NVLink (a 2-way bridge only joins pairs),
    else PCIe behind switches, without P2P where the driver refuses it (GeForce)."""
    from ceiling.spec.hardware import list_links

    names = {lk.name for lk in list_links()}
    if gpu.nvlink and not (gpu.nvlink.endswith("-bridge") and world > 2):
        return gpu.nvlink
    if not gpu.p2p_supported:
        for name in (f"pcie{gpu.pcie_gen}-nop2p", f"pcie{gpu.pcie_gen}-switch-nop2p"):
            if name in names:
                return name
    return f"pcie{gpu.pcie_gen}-switch"


def _memory(s: Any, batch: int, context: int) -> dict[str, float]:
    from ceiling.predict.step import GiB, kv_bytes_per_token_gpu, weight_resident_bytes

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


def _kinds(s: Any) -> dict[str, str]:
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


def _core(
    req: PredictRequest, spec: Any = None, curve: bool = True, strict: bool = True
) -> Prediction:
    """One prediction; ``strict`` raises when weights + KV do not fit (what-ifs report it)."""
    from ceiling.predict.step import decode_step, prefill_ms

    s, gpus = _setup(req, spec)
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
    step = decode_step(s, req.batch, req.context)
    ms = step.ms
    per_stream = 1e3 / ms
    points: list[BatchPoint] = []
    if curve:
        b, top = 1, max(1, min(max_batch, 1024))
        sizes = []
        while b <= top:
            sizes.append(b)
            b *= 2
        if top not in sizes:
            sizes.append(top)
        for bb in sizes:
            st = decode_step(s, bb, req.context)
            points.append(
                BatchPoint(
                    batch=bb,
                    step_ms=round(st.ms, 4),
                    tok_s_per_stream=round(1e3 / st.ms, 2),
                    aggregate_tok_s=round(bb * s.dep.dp * 1e3 / st.ms, 1),
                )
            )
    pre = prefill_ms(s, req.prompt_len) if curve else {}
    expected_block, bound_block = _blocks(step)
    comps = {k: round(v, 4) for k, v in step.components.items()}
    share = {k: round(v / ms, 4) for k, v in step.components.items()}
    kinds = {k: v for k, v in _kinds(s).items() if k in comps}
    assumptions = _assumptions(s, req, gpus, step)
    return Prediction(
        request=req.model_dump(),
        model={
            "name": s.spec.name,
            "architecture": s.spec.architecture,
            "attention": s.spec.attention,
            "layers": s.spec.num_layers,
            "total_params_B": round(s.spec.total_params() / 1e9, 2),
            "active_params_B": round(s.spec.active_params() / 1e9, 2),
            "weight_GB": round(s.spec.weight_bytes() / 1e9, 2),
            "quantization": s.spec.quant.summary,
            "experts": s.spec.n_experts,
            "top_k": s.spec.top_k,
        },
        hardware={
            "gpu": s.gpu.name,
            "gpus": gpus,
            "link": s.link.name,
            "p2p": s.link.p2p,
            "bw_GBps_achieved": round(s.bw_GBps, 1),
            "memory_GiB": s.gpu.memory_GiB,
        },
        deployment={**s.dep.model_dump(), "allreduce_impl": s.allreduce_impl},
        batch=req.batch,
        context=req.context,
        decode_ms_per_token=round(ms, 4),
        decode_tok_s_per_stream=round(per_stream, 2),
        aggregate_tok_s=round(req.batch * s.dep.dp * per_stream, 2),
        components_ms=comps,
        component_share=share,
        component_kind=kinds,
        fits_in_memory=fits,
        memory_GiB_per_gpu={k: round(v, 2) for k, v in mem.items() if not k.startswith("_")},
        kv_capacity_tokens=capacity,
        max_batch_at_context=max_batch,
        batch_curve=points,
        prefill={**{k: round(v, 3) for k, v in pre.items()}, "prompt_len": req.prompt_len}
        if pre
        else {},
        details=step.details,
        assumptions=assumptions,
        expected=expected_block,
        bound=bound_block,
        evidence=_evidence_summary(step),
    )


def _blocks(step: Any) -> tuple[StepBlock, StepBlock]:
    def block(ms: float, comps: dict[str, float], attr: str) -> StepBlock:
        ops = []
        for r in step.ops:
            v = getattr(r, attr)
            if v <= 0 and r.kind != "host":
                continue
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


def _evidence_summary(step: Any) -> dict[str, Any]:
    from ceiling.predict import tables

    ti = tables.info()
    by_source: dict[str, float] = {}
    for r in step.ops:
        by_source[r.source] = by_source.get(r.source, 0.0) + r.expected_ms
    total = sum(by_source.values()) or 1.0
    return {
        "tables": (
            f"aiconfigurator-core {ti.version}"
            + ("" if ti.pinned else f" (pinned {tables.PINNED})")
        )
        if ti
        else "not installed (pip install 'ceiling[tables]'): priors",
        "share_of_expected_by_source": {k: round(v / total, 3) for k, v in by_source.items()},
        "low_confidence_ops": [
            r.name for r in step.ops if r.confidence < 0.45 and r.expected_ms > 0.02 * total
        ],
    }


def _assumptions(s: Any, req: PredictRequest, gpus: int, step: Any) -> list[str]:
    from ceiling.predict.choices import host_cost

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
        f"layout: {gpus} x {s.gpu.name} over {s.link.name}; tp={d.tp} pp={d.pp} ep={d.ep} dp={d.dp}",
        f"kernels/step: {step.details['kernels_per_step']} ({step.details['gemm_kernels_per_step']} GEMMs "
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
            f"E(1-(1-k/E)^B) = {step.details.get('expected_distinct_experts')} per MoE layer"
            + (
                f", busiest of {d.ep} EP ranks"
                if d.ep > 1
                else f", each split {s.expert_tp} ways by TP"
            )
        )
    if spec.attention == "mla":
        out.append(
            "MLA latent KV (kv_lora_rank + rope dim) replicated on every TP rank; q_a/kv_a projections replicated"
        )
    if spec.attention == "hybrid":
        out.append(
            "linear-attention layers: recurrent state read and written each step, no per-token KV"
        )
    if s.profile is not None:
        out.append(f"measured profile applied: {req.profile}")
    out.extend(spec.notes)
    return out


# ----------------------------------------------------------------------------- public


def predict(req: PredictRequest) -> Prediction:
    """The prediction, with the batch curve, the prefill estimate and (if asked) the what-ifs."""
    pred = _core(req)
    if req.what_if:
        from ceiling.predict.whatif import what_ifs

        pred.what_if = what_ifs(req, pred)
    return pred


def variant(req: PredictRequest) -> tuple[Prediction | None, str]:
    """A what-if variant's prediction (no batch curve), or None and why it cannot run."""
    try:
        return _core(req, curve=False, strict=False), ""
    except CeilingError as err:
        return None, err.message
