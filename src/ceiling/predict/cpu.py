"""predict's CPU backend: the decode step's hardware floors on a CPU.

Why floors only: the GPU model's ``expected`` rests on kernel tables and engine rules measured
on GPUs; on a CPU nothing of the kind exists, yet "is this deployment bandwidth-bound?" still
has a numeric answer. A decode step must read the weights (once per step, whatever the batch)
and every sequence's KV cache, at the memory bandwidth this CPU achieves, and do ~2 FLOPs per
active parameter per token at the matrix-multiply rate it achieves. Those three floors are the
bound; launch, dispatch and host time are not predicted (no ``expected``), so whatever a
measurement adds to them is the unexplained remainder. The model is read once, by
``spec.model`` (the same ModelSpec the GPU model reads), and the rates come from the
:class:`~ceiling.spec.hardware.CpuHardware` the caller measured or assumed.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from ceiling.predict.core import load_spec, summary_of
from ceiling.predict.schema import (
    DeploymentUsed,
    HardwareUsed,
    ModelSummary,
    Prediction,
    PredictRequest,
    StepBlock,
    StepDetails,
)
from ceiling.spec.hardware import CpuHardware
from ceiling.spec.model import ModelSpec
from ceiling.spec.quant import dense

GiB = 2**30

KINDS = {
    "weights": "fundamental (weight bytes at this CPU's read bandwidth)",
    "kv": "fundamental (KV-cache bytes at this CPU's read bandwidth)",
    "compute": "fundamental (matrix math at this CPU's fp32 rate)",
}


def weight_bytes_per_step(spec: ModelSpec, tokens: int) -> float:
    """Weight bytes one decode step reads: every module once, the embedding one row per token
    (a lookup, as on a GPU)."""
    total = 0.0
    for m in spec.modules:
        total += tokens * m.nbytes / max(m.rows, 1) if m.kind == "embed" else m.nbytes
    return total


def kv_bytes_per_token(spec: ModelSpec) -> float:
    """KV bytes one token of context adds, all layers, at the model's dtype (as served)."""
    return spec.kv_bytes_per_token(dense(spec.dtype).bits / 8)


class Footprint(BaseModel):
    """What a CPU's floors read of a model, whatever described it (an HF config's ModelSpec, a
    GGUF header: ``predict.llamacpp_cpu``): the step's weight bytes are the caller's, at the
    request's batch."""

    summary: ModelSummary
    params: int
    active_params: float
    weight_bytes: float = Field(description="resident: every weight once")
    weight_bytes_read: float = Field(description="one decode step at the request's batch")
    kv_bytes_per_token: float
    dtype: str
    source: str
    weights_note: str = Field(description="why the step reads what it reads")
    kv_note: str = Field(description="the KV cache's dtype, and why")


def spec_footprint(spec: ModelSpec, batch: int) -> Footprint:
    """An HF model's footprint: every module once, the KV cache at the model's dtype."""
    return Footprint(
        summary=summary_of(spec),
        params=int(spec.total_params()),
        active_params=spec.active_params(),
        weight_bytes=spec.weight_bytes(),
        weight_bytes_read=weight_bytes_per_step(spec, batch),
        kv_bytes_per_token=kv_bytes_per_token(spec),
        dtype=spec.dtype,
        source=spec.source,
        weights_note=f"{spec.dtype}; the embedding is a lookup",
        kv_note="at the model's dtype",
    )


def floors_ms(
    spec: ModelSpec, cpu: CpuHardware, batch: int = 1, context: int = 0
) -> dict[str, float]:
    """The decode step's floors of an HF model on this CPU, in ms: weights, KV reads, compute."""
    return footprint_floors_ms(spec_footprint(spec, batch), cpu, batch, context)


def footprint_floors_ms(
    fp: Footprint, cpu: CpuHardware, batch: int = 1, context: int = 0
) -> dict[str, float]:
    """The floors of the model ``fp`` describes (its weight bytes already at ``batch``)."""
    bw = cpu.mem_bw_GBps * 1e9
    flops = 2.0 * batch * fp.active_params
    return {
        "weights": fp.weight_bytes_read / bw * 1e3,
        "kv": batch * context * fp.kv_bytes_per_token / bw * 1e3,
        "compute": flops / (cpu.gflops * 1e9) * 1e3,
    }


def predict_cpu(req: PredictRequest, cpu: CpuHardware) -> Prediction:
    """The floors of ``req.model`` on ``cpu`` at ``req.batch`` x ``req.context``."""
    return floors_prediction(
        req, cpu, spec_footprint(load_spec(req.model, req.weight_format), req.batch)
    )


def floors_prediction(req: PredictRequest, cpu: CpuHardware, fp: Footprint) -> Prediction:
    """The floors of the model ``fp`` describes on ``cpu`` at ``req.batch`` x ``req.context``."""
    comps = footprint_floors_ms(fp, cpu, req.batch, req.context)
    ms = sum(comps.values())
    tok_s = 1e3 / ms
    w_bytes = fp.weight_bytes_read
    kv_bytes = req.batch * req.context * fp.kv_bytes_per_token
    resident = (fp.weight_bytes + kv_bytes) / GiB
    rates = "measured" if cpu.measured else "ASSUMED (not measured)"
    bound = StepBlock(
        decode_ms_per_token=round(ms, 6),
        decode_tok_s_per_stream=round(tok_s, 2),
        components_ms={k: round(v, 6) for k, v in comps.items()},
        ops=[],
    )
    return Prediction(
        kind="cpu-floors",
        request=req,
        model=fp.summary,
        hardware=HardwareUsed(
            kind="cpu",
            cpu=cpu.name,
            gpus=0,
            link=None,
            p2p=None,
            bw_GBps_achieved=round(cpu.mem_bw_GBps, 3),
            memory_GiB=cpu.memory_GiB,
            gflops=round(cpu.gflops, 3),
        ),
        deployment=DeploymentUsed(engine=req.engine, cuda_graphs=False, allreduce_impl="none"),
        batch=req.batch,
        context=req.context,
        decode_ms_per_token=bound.decode_ms_per_token,
        decode_tok_s_per_stream=bound.decode_tok_s_per_stream,
        aggregate_tok_s=round(req.batch * tok_s, 2),
        components_ms=bound.components_ms,
        component_share={k: round(v / ms, 4) for k, v in comps.items()},
        component_kind=dict(KINDS),
        fits_in_memory=cpu.memory_GiB is None or resident <= cpu.memory_GiB,
        memory_GiB_per_gpu={
            "weights": round(fp.weight_bytes / GiB, 4),
            "kv": round(kv_bytes / GiB, 4),
        }
        | ({"total": round(cpu.memory_GiB, 2)} if cpu.memory_GiB else {}),
        kv_capacity_tokens=None,
        max_batch_at_context=None,
        batch_curve=[],
        prefill={},
        details=StepDetails(
            # the model's footprint as the floors read it (doctor.json's `model` block shows it)
            params=fp.params,
            kv_bytes_per_token=int(fp.kv_bytes_per_token),
            dtype=fp.dtype,
            source=fp.source,
            weight_bytes_read_per_gpu=int(w_bytes),
            kv_bytes_read_per_gpu=int(kv_bytes),
            flops_per_gpu=2.0 * req.batch * fp.active_params,
        ),
        assumptions=[
            f"CPU floors only, at this CPU's {rates} rates ({cpu.source}): "
            f"{cpu.mem_bw_GBps:.3g} GB/s read, {cpu.gflops:.3g} GFLOP/s",
            f"weights are read once per decode step: {w_bytes / 1e6:.3g} MB ({fp.weights_note})",
            f"KV cache {fp.kv_note}: {fp.kv_bytes_per_token / 1024:.3g} KiB per token of context",
            "launch, dispatch and host time are not predicted: they are the unexplained "
            "remainder of a measurement",
            f"decode at context {req.context} tokens; batch {req.batch}",
        ],
        expected=None,
        bound=bound,
    )
