"""``predict``: model + hardware + deployment -> the decode step, expected and bound, broken down.

The one public entry point is :func:`predict` (``PredictRequest`` in, ``Prediction`` out); the
CLI, ``doctor`` and the benchmarks all call it. The hardware is GPUs from the catalog (or a
probed box, ``PredictRequest.hardware``) or a CPU, predicted by its floors (``cpu.py``).
The nouns live in ``schema.py``, the GPU computation in ``core.py``, the what-if table in
``whatif.py``; this module only dispatches.
"""

from __future__ import annotations

from ceiling.predict.core import load_spec, predict_one, setup, variant
from ceiling.predict.cpu import predict_cpu
from ceiling.predict.engine_options import apply_trtllm_options
from ceiling.predict.interval import attach
from ceiling.predict.schema import (
    COMPONENTS,
    SCHEMA_VERSION,
    BatchPoint,
    ModelSummary,
    OpRecord,
    Prediction,
    PredictRequest,
    StepBlock,
    WhatIf,
)
from ceiling.predict.validate import check_request, in_vendor_words
from ceiling.predict.whatif import what_ifs
from ceiling.spec.hardware import load_gpu

__all__ = [
    "COMPONENTS",
    "SCHEMA_VERSION",
    "BatchPoint",
    "ModelSummary",
    "OpRecord",
    "PredictRequest",
    "Prediction",
    "StepBlock",
    "WhatIf",
    "load_spec",
    "predict",
    "predict_one",
    "setup",
    "variant",
]


def predict(req: PredictRequest) -> Prediction:
    """The prediction, with the batch curve, the prefill estimate and (if asked) the what-ifs.
    A request that describes no hardware or layout that exists is refused first
    (``validate.check_request``)."""
    req, option_notes = apply_trtllm_options(req)
    check_request(req)
    if req.engine == "llamacpp":  # a GGUF file on llama.cpp's own kernels (a CPU: its floors)
        from ceiling.predict.llamacpp_cpu import predict_llamacpp_cpu
        from ceiling.predict.llamacpp_files import predict_request

        if req.hardware is not None and req.hardware.kind == "cpu":
            return predict_llamacpp_cpu(req, req.hardware)
        return attach(predict_request(req))
    if req.hardware is not None and req.hardware.kind == "cpu":
        return predict_cpu(req, req.hardware)
    pred = predict_one(req)
    pred.assumptions += option_notes
    if req.what_if:
        pred.what_if = what_ifs(req, pred)
    in_vendor_words(pred, load_gpu(req.gpu_name()))
    return pred
