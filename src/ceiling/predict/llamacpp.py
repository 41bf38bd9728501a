"""``predict --engine llamacpp``: the decode step of a GGUF file on llama.cpp's CUDA kernels.

The predictor only: it takes the GGUF's read header and the profile's kernels and reads no file
nor starts a process (``predict.llamacpp_files`` reads them, ``probe.llamacpp_calibrate`` runs
llama.cpp's ``test-backend-ops``, ``flows.calibrate_llamacpp`` writes the profile), so the
diagnosis's nouns may import it (tests/test_import_contract.py).

llama.cpp reads every weight in its GGUF type (Q4_K, Q6_K, Q8_0, F16, IQ4_XS ...) with its own
mat-vec kernels, so the bytes per token come from the file's tensor types (ggml block layouts,
``engines/data/llamacpp_kernels.yaml``, read by ``predict.gguf``), not from a PyTorch dtype.
One token's step:

    step = sum over weight matrices read (t0 + bytes / achieved bandwidth of that type)
         + KV bytes at the context / bandwidth + small kernels x their cost (graph or eager)

The achieved bandwidth per type is a prior (the hopper bf16 mat-vec prior for every type) or,
with a profile from ``ceiling calibrate --engine llamacpp``, what llama.cpp's own kernels did on
this GPU (test-backend-ops perf). The bound is the same bytes at the datasheet bandwidth.
MoE files read the routed experts only (expert_used_count of expert_count per layer).

The answer is predict's own ``Prediction`` (components ``weights``, ``kv``, ``launch``; one op
per weight type, the KV read and the small kernels, each with its evidence), so the doctor, the
report and ``--json`` read one shape; what only llama.cpp has (the GGUF's weight types, bytes per
token, flash attention) is ``details.llamacpp``. One stream only: no batch curve, no KV capacity.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, Field

from ceiling.errors import CeilingError
from ceiling.predict.gguf import GgufInfo, GgufTensor, bits_per_weight, kernel_data
from ceiling.predict.gguf_mix import mix_assumption
from ceiling.predict.ladder import ladder
from ceiling.predict.llamacpp_fit import (
    MatvecFit,
    fit_points,
    median_t0,
    points_from_sql,
    sql_rows,
)
from ceiling.predict.schema import (
    DeploymentUsed,
    EvidenceSummary,
    GgufWeightsRead,
    HardwareUsed,
    LlamaCppDetails,
    ModelSummary,
    OpRecord,
    Prediction,
    PredictRequest,
    StepBlock,
    StepDetails,
)
from ceiling.spec.profile import HardwareProfile
from ceiling.spec.quant import GGUF_MIXES


class MatvecRate(BaseModel):
    """One weight type's measured mat-vec: bytes read and time (test-backend-ops perf)."""

    type: str
    bytes: float
    time_us: float
    shape: str = ""

    @property
    def GBps(self) -> float:
        return self.bytes / self.time_us / 1e3


class LlamaCppProfile(BaseModel):
    """``ceiling calibrate --engine llamacpp``: llama.cpp's own kernels on one GPU, the
    ``llamacpp`` entry of a profile's ``engine`` section (``spec.profile``). ``matvec``:
    one rate per type at one large matrix; ``matvec_fit`` / ``expert_fit``: t0 + bytes / rate
    per type fitted at the models' decode shapes (``predict.llamacpp_fit``), used first."""

    gpu: str | None = None
    source: str = ""
    matvec: dict[str, MatvecRate] = Field(default_factory=dict)
    matvec_fit: dict[str, MatvecFit] = Field(default_factory=dict)
    expert_fit: dict[str, MatvecFit] = Field(default_factory=dict)


def weights_read(info: GgufInfo, tokens: int = 1) -> Iterator[tuple[GgufTensor, float]]:
    """Each weight tensor with the share of it one step of ``tokens`` tokens reads: one
    embedding row per token, the experts the tokens route to (uniform routing: the expected
    distinct share, 1 - (1 - k/n)^tokens), every other matrix whole."""
    n_exp, used = info.int_key("expert_count"), info.int_key("expert_used_count")
    for t in info.tensors:
        if not t.name.endswith(".weight") or len(t.shape) < 2:
            continue  # norms and biases: small kernels
        if t.name.startswith("token_embd"):
            yield t, min(tokens, t.shape[1]) / t.shape[1]  # one row per token (get_rows)
        elif "_exps." in t.name and n_exp:
            yield t, used / n_exp if tokens == 1 else 1.0 - (1.0 - used / n_exp) ** tokens
        else:
            yield t, 1.0


class _Op(BaseModel):
    """One op of the step before it is shaped into predict's blocks."""

    name: str
    component: str
    count: float
    expected_ms: float
    bound_ms: float
    source: str
    confidence: float
    kernel: str
    note: str
    bytes: float = 0.0


def _weight_ops(
    info: GgufInfo, bw: float, profile: LlamaCppProfile | None
) -> tuple[list[_Op], list[GgufWeightsRead]]:
    """One mat-vec op per weight type the token reads (its rate measured, else the prior)."""
    pri, conf = kernel_data().priors, ladder().confidence
    by_type: dict[str, list[float]] = {}
    fitted: dict[str, float] = {}  # seconds of the types a decode-shape fit covers
    for t, share in weights_read(info):
        by_type.setdefault(t.type, []).append(t.nbytes * share)
        if profile and (fit := _fit_for(profile, t)) is not None:
            # the embedding is one row's get_rows, not a mat-vec: no mat-vec fixed cost
            t0 = 0.0 if t.name.startswith("token_embd") else fit.t0_us
            fitted[t.type] = (
                fitted.get(t.type, 0.0) + (t0 + t.nbytes * share / (fit.GBps * 1e3)) * 1e-6
            )
    ops, reads = [], []
    for typ, sizes in sorted(by_type.items()):
        total = sum(sizes)
        rate = profile.matvec.get(typ) if profile else None
        if profile and typ in fitted:
            exp_s, source, c = fitted[typ], "profile", conf.profile.kernel
            f = profile.matvec_fit.get(typ) or profile.expert_fit[typ]
            src = f"llama.cpp mat-vec fit {f.t0_us:.2f} us + bytes / {f.GBps:.0f} GB/s"
        elif profile and rate is not None and profile.matvec_fit:
            # a type timed at one shape only: its rate, and the fitted types' median fixed cost
            t0 = median_t0(profile.matvec_fit)
            exp_s = len(sizes) * t0 * 1e-6 + total / (rate.GBps * 1e9)
            src = f"llama.cpp mat-vec {rate.GBps:.0f} GB/s + median t0 {t0:.2f} us"
            source, c = "profile", conf.profile.kernel
        elif rate is not None:
            # measured on a matrix large enough that its fixed cost is inside the rate
            exp_s, src = total / (rate.GBps * 1e9), f"llama.cpp mat-vec {rate.GBps:.0f} GB/s"
            source, c = "profile", conf.profile.kernel
        else:
            exp_s = len(sizes) * pri.matvec_t0_us * 1e-6 + total / (pri.matvec_eff * bw)
            src = f"prior: {pri.matvec_t0_us} us + {pri.matvec_eff} x bandwidth"
            # the prior is the 16-bit mat-vec's: a quantized type borrows it
            source = "prior"
            c = conf.prior.own_class if typ in _SIXTEEN_BIT else conf.prior.borrowed_class
        ops.append(
            _Op(
                name=f"weights {typ}",
                component="weights",
                count=len(sizes),
                expected_ms=exp_s * 1e3,
                bound_ms=total / bw * 1e3,
                source=source,
                confidence=c,
                kernel="mmvf" if typ in _SIXTEEN_BIT else "mmvq",
                note=src,
                bytes=total,
            )
        )
        reads.append(GgufWeightsRead(type=typ, matrices=len(sizes), bytes=total))
    return ops, reads


_SIXTEEN_BIT = ("F32", "F16", "BF16")  # mmvf.cu: no dequantization


def _fit_for(profile: LlamaCppProfile, t: GgufTensor) -> MatvecFit | None:
    """The decode-shape fit of tensor ``t``: routed experts MUL_MAT_ID's (else MUL_MAT's)."""
    if "_exps." in t.name and t.type in profile.expert_fit:
        return profile.expert_fit[t.type]
    return profile.matvec_fit.get(t.type)


def kv_bytes_per_token(info: GgufInfo) -> int:
    """K and V of one token of context, all layers, in f16 (llama.cpp's default cache type)."""
    heads = info.int_key("attention.head_count")
    head_dim = info.int_key("attention.key_length")
    if not head_dim and heads:
        head_dim = info.int_key("embedding_length") // heads
    return 2 * info.int_key("block_count") * info.int_key("attention.head_count_kv") * head_dim * 2


def _kv_op(info: GgufInfo, bw: float, context: int, flash_attention: bool) -> _Op:
    pri = kernel_data().priors
    layers = info.int_key("block_count")
    kv_bytes = kv_bytes_per_token(info) * context
    kv_extra = 1.0 if flash_attention else 2.0  # without FA the scores are written and re-read
    return _Op(
        name="KV cache (f16)",
        component="kv",
        count=layers,
        expected_ms=kv_extra * kv_bytes / (pri.matvec_eff * bw) * 1e3,
        bound_ms=kv_bytes / bw * 1e3,
        source="prior",
        confidence=ladder().confidence.prior.own_class,
        kernel="fattn-vec" if flash_attention else "kq-softmax-kqv",
        note=f"context {context}",
        bytes=kv_bytes,
    )


def _small_op(info: GgufInfo, cuda_graphs: bool, flash_attention: bool) -> _Op:
    pri, kern = kernel_data().priors, kernel_data().kernels
    layer = kern.moe_layer if info.key("expert_count") else kern.dense_layer
    per_layer = layer.small + (0 if flash_attention else kern.attention_off_extra_small)
    small = info.int_key("block_count") * per_layer + kern.head.small
    small_us = pri.small_us_graph if cuda_graphs else pri.small_us_eager
    return _Op(
        name="small kernels",
        component="launch",
        count=small,
        expected_ms=small * small_us * 1e-3,
        bound_ms=0.0,
        source="prior",
        confidence=ladder().confidence.prior.elementwise,
        kernel="elementwise",
        note=f"{small} x {small_us} us ({'CUDA graph' if cuda_graphs else 'eager'})",
    )


def _block(ops: list[_Op], bound: bool) -> StepBlock:
    ms = sum(o.bound_ms if bound else o.expected_ms for o in ops)
    comps: dict[str, float] = {}
    for o in ops:
        comps[o.component] = comps.get(o.component, 0.0) + (o.bound_ms if bound else o.expected_ms)
    return StepBlock(
        decode_ms_per_token=ms,
        decode_tok_s_per_stream=1e3 / ms if ms > 0 else 0.0,
        components_ms=comps,
        ops=[
            OpRecord(
                name=o.name,
                count=o.count,
                ms=o.bound_ms,
                source="physics",
                confidence=1.0,
                kernel=o.kernel,
            )
            if bound
            else OpRecord(
                name=o.name,
                count=o.count,
                ms=o.expected_ms,
                source=o.source,
                confidence=o.confidence,
                kernel=o.kernel,
                note=o.note,
            )
            for o in ops
            if not bound or o.bound_ms > 0
        ],
    )


_KINDS = {
    "weights": "fundamental (bandwidth x the GGUF's weight types)",
    "kv": "fundamental (context x KV dtype; flash attention reads it once)",
    "launch": "configurable (small kernels: CUDA graphs; the engine's kernels)",
}


def active_params(info: GgufInfo) -> float:
    """Parameters one token uses: every tensor, the experts at expert_used_count / expert_count."""
    n_exp, used = info.int_key("expert_count"), info.int_key("expert_used_count")
    routed = used / n_exp if n_exp else 1.0
    return sum(t.params * (routed if "_exps." in t.name else 1.0) for t in info.tensors)


def model_summary(info: GgufInfo) -> ModelSummary:
    """The GGUF's model as predict's summary: its shape and its weight types by bytes."""
    n_exp, used = info.int_key("expert_count"), info.int_key("expert_used_count")
    total, active = sum(t.params for t in info.tensors), active_params(info)
    nbytes = sum(t.nbytes for t in info.tensors)
    by_type: dict[str, float] = {}
    for t in info.tensors:
        by_type[t.type] = by_type.get(t.type, 0.0) + t.nbytes
    mix = ", ".join(
        f"{k} {v / nbytes * 100:.0f} %" for k, v in sorted(by_type.items(), key=lambda kv: -kv[1])
    )
    heads, kv = info.int_key("attention.head_count"), info.int_key("attention.head_count_kv")
    return ModelSummary(
        name=str(info.metadata.get("general.name") or Path(info.path).stem),
        architecture=info.arch,
        attention="mha" if kv in (0, heads) else "gqa",
        layers=info.int_key("block_count"),
        hidden_size=info.int_key("embedding_length"),
        total_params_B=round(total / 1e9, 2),
        active_params_B=round(active / 1e9, 2),
        weight_GB=round(nbytes / 1e9, 2),
        weight_bytes=int(nbytes),
        quantization=f"GGUF: {mix}" if mix else "GGUF",
        experts=n_exp,
        top_k=used,
    )


def gguf_step(
    info: GgufInfo,
    gpu_name: str,
    bandwidth_GBps: float,
    context: int = 1024,
    cuda_graphs: bool = True,
    flash_attention: bool = True,
    profile: LlamaCppProfile | None = None,
    memory_GiB: float | None = None,
    request: PredictRequest | None = None,
) -> Prediction:
    """The single-stream decode step of a GGUF's read header on one GPU of ``bandwidth_GBps``
    (and ``memory_GiB``, when known: whether the file fits), as predict's ``Prediction``.
    ``request``: the request this answers (``predict()``'s); else one is made. The file is read
    by ``predict.llamacpp_files.predict_gguf``: this module reads nothing."""
    bw = bandwidth_GBps * 1e9
    w_ops, reads = _weight_ops(info, bw, profile)
    kv = _kv_op(info, bw, context, flash_attention)
    ops = [*w_ops, kv, _small_op(info, cuda_graphs, flash_attention)]
    expected, bound = _block(ops, bound=False), _block(ops, bound=True)
    step = expected.decode_ms_per_token
    w_bytes = sum(r.bytes for r in reads)
    summary = model_summary(info)
    GiB = 2**30
    mem = {"weights": summary.weight_bytes / GiB, "kv": kv.bytes / GiB}
    fits = memory_GiB is None or mem["weights"] + mem["kv"] <= memory_GiB
    evidence = f"llama.cpp kernels measured: {profile.source}" if profile else "priors only"
    by_source: dict[str, float] = {}
    for o in ops:
        by_source[o.source] = by_source.get(o.source, 0.0) + o.expected_ms
    # a profile given as an object has no file to name (its source is in the evidence)
    req = request or PredictRequest(
        model=info.path,
        gpu=gpu_name,
        engine="llamacpp",
        cuda_graphs=cuda_graphs,
        context=context,
        flash_attention=flash_attention,
    )
    return Prediction(
        request=req,
        model=summary,
        hardware=HardwareUsed(
            gpu=gpu_name,
            gpus=1,
            link=None,
            p2p=None,
            bw_GBps_achieved=w_bytes / (expected.components_ms["weights"] * 1e6)
            if w_bytes
            else bandwidth_GBps,
            memory_GiB=memory_GiB,
        ),
        deployment=DeploymentUsed(
            engine="llamacpp", cuda_graphs=cuda_graphs, allreduce_impl="none"
        ),
        batch=1,
        context=context,
        decode_ms_per_token=step,
        decode_tok_s_per_stream=1000.0 / step,
        aggregate_tok_s=1000.0 / step,
        components_ms=expected.components_ms,
        component_share={k: v / step for k, v in expected.components_ms.items()},
        component_kind=dict(_KINDS),
        fits_in_memory=fits,
        memory_GiB_per_gpu=mem | ({"total": memory_GiB} if memory_GiB else {}),
        kv_capacity_tokens=None,
        max_batch_at_context=None,
        batch_curve=[],
        prefill={},
        details=StepDetails(
            weight_bytes_read_per_gpu=int(w_bytes),
            weight_bytes_read_by_kind={r.type: int(r.bytes) for r in reads},
            kv_bytes_read_per_gpu=int(kv.bytes),
            kernels_per_step=int(sum(o.count for o in ops)),
            gemm_kernels_per_step=int(sum(o.count for o in w_ops)),
            flops_per_gpu=2.0 * summary.active_params_B * 1e9,
            source=info.path,
            llamacpp=LlamaCppDetails(
                gguf=info.path,
                arch=info.arch,
                flash_attention=flash_attention,
                bytes_per_token=sum(o.bytes for o in ops),
                kv_bytes=kv.bytes,
                weights=reads,
                kernel_profile=profile.source if profile else None,
            ),
        ),
        assumptions=[
            f"GGUF {Path(info.path).name}: {summary.line()}",
            f"one stream on one GPU ({gpu_name}, {bandwidth_GBps:g} GB/s datasheet): "
            f"{sum(o.bytes for o in ops) / 1e9:.3g} GB read per token",
            "mat-vec per weight type: "
            + (
                "llama.cpp's own kernels measured (" + profile.source + ")"
                if profile
                else "the hopper 16-bit mat-vec prior for every type (calibrate --engine llamacpp "
                "measures llama.cpp's)"
            ),
            f"KV cache f16 at context {context}, flash attention "
            f"{'on' if flash_attention else 'off (scores written and re-read)'}",
            f"small kernels {'inside a CUDA graph' if cuda_graphs else 'launched one by one'}",
        ],
        expected=expected,
        bound=bound,
        evidence=EvidenceSummary(
            tables=evidence,
            share_of_expected_by_source={k: round(v / step, 3) for k, v in by_source.items()},
            low_confidence_ops=[
                o.name for o in ops if o.confidence < 0.45 and o.expected_ms > 0.02 * step
            ],
        ),
    )


_PARAM = re.compile(r"type_a=(\w+),type_b=\w+,m=(\d+),n=1,k=(\d+),")


def profile_from_sql(
    text: str, gpu: str | None = None, source: str = "", with_fits: bool = False
) -> LlamaCppProfile:
    """``test-backend-ops perf --output sql`` (MUL_MAT at one token) -> a profile: each weight
    type's bytes read over the time per run, at the type's largest matrix. ``with_fits``: the
    decode-shape rows also give t0 + rate fits (predict uses them first); off by default, as
    that refit overstated every measured H200 step (docs/predict.md, llama.cpp section)."""
    prof = LlamaCppProfile(gpu=gpu, source=source or "test-backend-ops perf (MUL_MAT, n=1)")
    for row in sql_rows(text):
        p = _PARAM.search(row.get("op_params", ""))
        if row.get("op_name") != "MUL_MAT" or not p or float(row.get("time_us") or 0) <= 0:
            continue
        typ, rows_, cols = p.group(1).upper(), int(p.group(2)), int(p.group(3))
        nbytes = rows_ * cols * bits_per_weight(typ) / 8.0 if typ in kernel_data().types else 0
        prof.gpu = prof.gpu or row.get("device_description") or None
        if not nbytes or (typ in prof.matvec and prof.matvec[typ].bytes >= nbytes):
            continue  # unknown type; else the rate is the type's largest matrix (bandwidth-bound)
        prof.matvec[typ] = MatvecRate(
            type=typ, bytes=nbytes, time_us=float(row["time_us"]), shape=f"{rows_}x{cols}"
        )
    if with_fits:  # test-file rows (experiments/gpu/ops/matvec-*.txt): t0 + rate fits
        prof.matvec_fit, prof.expert_fit = fit_points(points_from_sql(text))
    if not prof.matvec and not prof.matvec_fit:
        raise CeilingError(
            "no MUL_MAT timing at one token in the test-backend-ops output",
            fix="run `test-backend-ops perf -b CUDA0 -o MUL_MAT --output sql -p 'n=1,'`",
        )
    return prof


#: the entry of a profile's ``engine`` section this predictor reads
ENGINE = "llamacpp"
_FIX = "write one with `ceiling calibrate --engine llamacpp --out FILE`"


def kernels_of(profile: HardwareProfile, where: str | Path) -> LlamaCppProfile:
    """llama.cpp's kernels in ``profile`` (read from ``where``): its engine section's entry."""
    section = profile.engine.get(ENGINE)
    if section is None:
        raise CeilingError(f"{where} holds no llama.cpp kernel profile", fix=_FIX)
    try:
        return LlamaCppProfile.model_validate({"gpu": profile.gpu, **section})
    except ValueError as exc:
        raise CeilingError(
            f"{where}: its llama.cpp entry is not a kernel profile ({type(exc).__name__})",
            fix=_FIX,
        ) from None


def as_profile(kernels: LlamaCppProfile) -> HardwareProfile:
    """The profile file ``calibrate --engine llamacpp`` writes: the kernels as its section."""
    return HardwareProfile(gpu=kernels.gpu, engine={ENGINE: kernels.model_dump()})


def needs_gguf() -> CeilingError:
    """The error of a llama.cpp prediction without a GGUF file."""
    return CeilingError(
        "predict --engine llamacpp reads the weight types from a GGUF file, or from a "
        "llama.cpp file type applied to a model config",
        fix="pass --gguf FILE.gguf (its header is read; no tensor data), or --model NAME "
        "--weight-format " + "|".join(GGUF_MIXES),
    )


def one_stream(req: PredictRequest) -> None:
    """Refuse what this predictor does not model: a batch or a split over GPUs."""
    if req.batch > 1 or req.tp * req.pp > 1:
        raise CeilingError(
            "predict --engine llamacpp predicts one stream on one GPU",
            fix="drop --batch, --tp and --pp (llama.cpp's split modes are not predicted yet)",
        )


def predict_llamacpp(
    req: PredictRequest, model: GgufInfo, kernels: LlamaCppProfile | None, mix: bool
) -> Prediction:
    """``predict()`` for ``engine: llamacpp``: one stream on one GPU of the catalog, ``model``
    the GGUF's header (``mix``: a llama.cpp file type applied to a model config, no file) and
    ``kernels`` the profile's llama.cpp entry. The files are read by
    ``predict.llamacpp_files.predict_request``; a CPU is ``predict.llamacpp_cpu``'s."""
    from ceiling.spec.hardware import load_gpu

    one_stream(req)
    gpu = load_gpu(req.gpu_name())
    pred = gguf_step(
        model,
        gpu.name,
        gpu.mem_bw_GBps,
        req.context,
        req.cuda_graphs,
        req.flash_attention is not False,
        profile=kernels,
        memory_GiB=gpu.memory_GiB,
        request=req,
    )
    if mix:
        pred.assumptions.insert(1, mix_assumption(req.weight_format or ""))
    return pred
