"""What ``predict --engine llamacpp`` reads: the GGUF header and the profile's kernels.

Apart from the predictor (``predict.llamacpp``), which takes what these files held: it stays a
pure function of its inputs, and this module is the one place the llama.cpp prediction opens a
file. ``predict.api`` dispatches ``engine: llamacpp`` here.
"""

from __future__ import annotations

from pathlib import Path

from ceiling.errors import CeilingError
from ceiling.predict.gguf import GgufInfo, gguf_error, is_gguf, read_gguf
from ceiling.predict.gguf_mix import mix_info
from ceiling.predict.llamacpp import (
    LlamaCppProfile,
    gguf_step,
    kernels_of,
    needs_gguf,
    one_stream,
    predict_llamacpp,
)
from ceiling.predict.schema import Prediction, PredictRequest
from ceiling.spec.profile import load_profile


def load_kernels(path: str | Path) -> LlamaCppProfile:
    """llama.cpp's kernels of a profile file (any version: ``spec.profile.load_profile``)."""
    return kernels_of(load_profile(path), path)


def predict_gguf(
    gguf: str | Path | GgufInfo,
    gpu_name: str,
    bandwidth_GBps: float,
    context: int = 1024,
    cuda_graphs: bool = True,
    flash_attention: bool = True,
    profile: LlamaCppProfile | None = None,
    memory_GiB: float | None = None,
    request: PredictRequest | None = None,
) -> Prediction:
    """``predict.llamacpp.gguf_step`` of a GGUF file (its header read here) or of a read one."""
    info = gguf if isinstance(gguf, GgufInfo) else read_gguf(gguf)
    return gguf_step(
        info,
        gpu_name,
        bandwidth_GBps,
        context,
        cuda_graphs,
        flash_attention,
        profile=profile,
        memory_GiB=memory_GiB,
        request=request,
    )


def predict_request(req: PredictRequest) -> Prediction:
    """``predict()`` for ``engine: llamacpp`` on a GPU: ``req.model`` is the GGUF file (or a
    model config with ``req.weight_format`` a llama.cpp file type), ``req.profile`` a calibrate
    --engine llamacpp profile. Refusals come in the order they always did: the model, then the
    layout, then the profile, then the file's header."""
    mixed: GgufInfo | None = None
    if not is_gguf(req.model):
        if not req.weight_format or req.model.endswith(".gguf"):  # a file asked for: why not
            raise gguf_error(req.model) or needs_gguf()
        mixed = mix_info(req.model, req.weight_format)
    elif req.weight_format:  # the file's own types are the answer: a format would be ignored
        raise CeilingError(
            f"--weight-format {req.weight_format} with a GGUF file: the file's types are read",
            fix="drop --weight-format, or pass --model NAME to price a mix without a file",
        )
    one_stream(req)
    kernels = load_kernels(req.profile) if req.profile else None
    model = mixed or read_gguf(req.model)
    return predict_llamacpp(req, model, kernels, mix=mixed is not None)
