"""A GGUF file on a CPU: the floors only, as predict gives every engine on a CPU.

``predict --engine llamacpp`` models llama.cpp's CUDA kernels (mat-vec priors and profiles
measured on GPUs); for llama.cpp's CPU kernels there is no such model. What a CPU step must do
is still known from the file: read the weights in their GGUF types (the routed experts, one
embedding row per token), read the KV cache, and do ~2 FLOPs per active parameter per token.
Those floors at the CPU's measured rates are the bound (``predict.cpu``); there is no
``expected``, and the assumptions say why.
"""

from __future__ import annotations

from ceiling.predict.cpu import Footprint, floors_prediction
from ceiling.predict.gguf import GgufInfo, gguf_error, is_gguf, read_gguf
from ceiling.predict.llamacpp import (
    active_params,
    kv_bytes_per_token,
    model_summary,
    needs_gguf,
    weights_read,
)
from ceiling.predict.schema import Prediction, PredictRequest
from ceiling.spec.hardware import CpuHardware

NO_CPU_MODEL = (
    "predict --engine llamacpp has no model of llama.cpp's CPU kernels: CPU floors of the "
    "GGUF's bytes only"
)


def gguf_footprint(info: GgufInfo, batch: int) -> Footprint:
    """What the CPU floors read of a GGUF file at ``batch`` tokens per step."""
    summary = model_summary(info)
    types = ", ".join(sorted({t.type for t, _ in weights_read(info)}))
    return Footprint(
        summary=summary,
        params=sum(t.params for t in info.tensors),
        active_params=active_params(info),
        weight_bytes=summary.weight_bytes,
        weight_bytes_read=sum(t.nbytes * share for t, share in weights_read(info, batch)),
        kv_bytes_per_token=kv_bytes_per_token(info),
        dtype=f"GGUF {types}",
        source=info.path,
        weights_note=f"their GGUF types {types}; routed experts only; the embedding is a lookup",
        kv_note="f16 (llama.cpp's default cache type)",
    )


def predict_llamacpp_cpu(req: PredictRequest, cpu: CpuHardware) -> Prediction:
    """The floors of the GGUF ``req.model`` on ``cpu`` at ``req.batch`` x ``req.context``."""
    if not is_gguf(req.model):
        raise gguf_error(req.model) or needs_gguf()
    pred = floors_prediction(req, cpu, gguf_footprint(read_gguf(req.model), req.batch))
    pred.assumptions.insert(0, NO_CPU_MODEL)
    return pred
