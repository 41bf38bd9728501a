"""What the hardware allows for the deployment the doctor examines (its "expected" side).

Why a module of its own: the doctor's flow (``ceiling.flows.doctor``) sequences stages and
finds the hardware and the model (``ceiling.flows.hardware``: probing is I/O); deciding which
configuration to predict (TP and CUDA graphs from options, the engine log or the variant) and
asking predict lives here. Pure functions: options and facts in, nouns out; no I/O.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ceiling.diagnose.facts import EngineFacts
from ceiling.diagnose.schema import DoctorConfig, ModelInfo
from ceiling.engines.diagnosis_data import GGUF_PREDICTION, file_prediction
from ceiling.errors import CeilingError
from ceiling.predict.api import Prediction, PredictRequest, predict
from ceiling.spec.hardware import CpuHardware, Hardware

PREDICTED_ENGINES = ("vllm", "sglang", "trtllm")


def serves_gguf(engine: str | None, facts: EngineFacts | None) -> bool:
    """Whether the target is predicted from the GGUF file it serves (``engines.diagnosis_data``'s
    trait): its engine (option, variant or ``owned_by``), else its start-up log's."""
    return file_prediction(engine, facts.engine if facts is not None else None) is not None


class GgufFile(BaseModel):
    """The GGUF a target predicted from its file serves, and where the doctor found its name."""

    path: str
    source: str = Field(description="--model, the variant's model, the server's /props, the log")


def arg_value(variant: Any, *names: str) -> str | None:
    """The value of a variant's flag (``true`` for a bare switch), None when absent."""
    for a in getattr(variant, "args", []) or []:
        if a.flag.lstrip("-") in names:
            return str(a.values[0]) if a.values else "true"
    return None


def request_for(
    cfg: DoctorConfig,
    hardware: Hardware,
    model: str,
    facts: EngineFacts | None,
    variant: Any,
) -> PredictRequest:
    """The configuration the server runs, as predict is asked about it (single stream, with
    the what-ifs): TP and CUDA graphs from the options, else the log's facts, else the
    variant's flags."""
    tp = cfg.tp or (facts.tensor_parallel_size if facts else None)
    tp = tp or int(arg_value(variant, "tensor-parallel-size", "tp") or 1)
    graphs = cfg.cuda_graphs
    if graphs is None and facts is not None and facts.enforce_eager is not None:
        graphs = not facts.enforce_eager and facts.cudagraph_mode not in ("NONE",)
    if graphs is None:
        graphs = arg_value(variant, "enforce-eager") not in ("true", "True", "1")
    engine = cfg.engine or "vllm"
    return PredictRequest(
        model=model,
        hardware=hardware,
        tp=tp,
        gpus=max(tp, 1),
        engine=engine if engine in PREDICTED_ENGINES else "generic",
        cuda_graphs=graphs,
        batch=1,
        context=cfg.single_context,
        prompt_len=cfg.input_len,
        what_if=True,
        profile=cfg.profile,  # its hardware part, as predict --profile reads it
        **_speculative(facts),
        **_context_parallel(facts, model, engine),
    )


def _context_parallel(facts: EngineFacts | None, model: str, engine: str) -> dict[str, Any]:
    """The server's decode context parallel (``decode_context_parallel_size`` of vLLM's config
    line) where predict models it (predict.validate.check_dcp): a layout it refuses is left
    out of the prediction rather than failing the whole doctor run."""
    dcp = facts.decode_context_parallel_size if facts is not None else None
    if not dcp or dcp <= 1 or engine != "vllm":
        return {}
    from ceiling.predict.core import load_spec
    from ceiling.predict.validate import check_dcp

    tp = facts.tensor_parallel_size if facts is not None else None
    try:
        check_dcp(engine, dcp, tp or dcp, load_spec(model, None))
    except CeilingError:
        return {}
    return {"dcp": dcp}


def _speculative(facts: EngineFacts | None) -> dict[str, Any]:
    """The server's speculative decoding as predict's request fields: the method and drafted
    tokens from the engine's config, the acceptance length the engine measured (its metrics
    line) when it is within 1..k+1."""
    if facts is None or facts.spec_method is None:
        return {}
    out: dict[str, Any] = {"spec": facts.spec_method, "spec_tokens": facts.spec_tokens}
    tau, k = facts.spec_mean_acceptance, facts.spec_tokens
    if tau is not None and k is not None and 1.0 <= tau <= k + 1:
        out["spec_acceptance_length"] = tau
    return out


class Expectation(BaseModel):
    """predict's answer for the examined configuration, and what the report says about it."""

    prediction: Prediction
    model: ModelInfo
    note: str | None = Field(None, description="what the prediction does not cover")
    assumptions: list[str] = Field(default_factory=list)
    predictor: str = Field("", description="which predictor, on which evidence (one line)")


def expect(
    cfg: DoctorConfig,
    hardware: Hardware,
    model_dir: str | None,
    served: str | None,
    facts: EngineFacts | None,
    variant: Any,
    gguf: GgufFile | None = None,
) -> Expectation:
    """Predict the examined configuration (a CPU: its floors only); a target that serves a GGUF
    (``gguf``: the file) through the predictor of its file (``GGUF_PREDICTION``)."""
    if gguf is not None:
        return _expect_gguf(cfg, hardware, gguf, served, facts, variant)
    if model_dir is None:
        raise CeilingError(
            "cannot find the model config",
            fix="pass --model (a model directory, its config.json or a catalog name)",
        )
    pred = predict(request_for(cfg, hardware, model_dir, facts, variant))
    note = None
    if isinstance(hardware, CpuHardware):
        note = (
            "predict's GPU model does not apply to a CPU: only the floors are predicted (the "
            f"model's bytes and FLOPs at this CPU's "
            f"{'measured' if hardware.measured else 'ASSUMED'} rates); launch/host components "
            "are not predicted, so they appear in the unexplained remainder"
        )
    return Expectation(
        prediction=pred,
        model=_model_info(served, model_dir, pred),
        note=note,
        assumptions=list(pred.assumptions),
        predictor="predict's CPU floors (the model's bytes and FLOPs)"
        if pred.kind == "cpu-floors"
        else f"predict --engine {pred.request.engine}, evidence: tables {pred.evidence.tables}",
    )


def gguf_request(
    cfg: DoctorConfig, hardware: Hardware, gguf: str, facts: EngineFacts | None, variant: Any
) -> PredictRequest:
    """The GGUF server's configuration as its file's predictor is asked about it (one stream):
    CUDA graphs and flash attention from the options, the log, else the variant."""
    fp = GGUF_PREDICTION
    graphs = cfg.cuda_graphs
    if graphs is None and facts is not None and facts.enforce_eager is not None:
        graphs = not facts.enforce_eager
    if graphs is None:  # the engine's variable, set at all, turns graphs off
        graphs = fp.graphs_off_env not in (getattr(variant, "env", None) or {})
    fa = facts.flash_attention if facts is not None else None
    if fa is None:
        flag = arg_value(variant, *fp.flash_attention_flags)
        fa = None if flag is None else flag.lower() not in ("off", "0", "false", "disabled")
    return PredictRequest(
        model=gguf,
        hardware=hardware,
        engine=fp.predict_engine,
        cuda_graphs=graphs,
        flash_attention=fa,
        batch=1,
        context=cfg.single_context,
        prompt_len=cfg.input_len,
        profile=cfg.profile,
    )


def _expect_gguf(
    cfg: DoctorConfig,
    hardware: Hardware,
    gguf: GgufFile,
    served: str | None,
    facts: EngineFacts | None,
    variant: Any,
) -> Expectation:
    """A GGUF target: its file through its predictor (a CPU: the GGUF's floors, said so:
    predict has no model of the engine's CPU kernels)."""
    fp = GGUF_PREDICTION
    pred = predict(gguf_request(cfg, hardware, gguf.path, facts, variant))
    name = f"{Path(gguf.path).name} (from {gguf.source})"
    note: str | None
    if isinstance(hardware, CpuHardware):
        from ceiling.predict.llamacpp_cpu import NO_CPU_MODEL

        note = (
            f"{NO_CPU_MODEL} ({name}) at this CPU's "
            f"{'measured' if hardware.measured else 'ASSUMED'} rates; launch/host components are "
            "not predicted, so they appear in the unexplained remainder"
        )
        predictor = f"{NO_CPU_MODEL}: {name}"
    else:
        note = (
            f"one GPU's step: {fp.label}'s split over {hardware.gpus} GPUs is not predicted"
            if hardware.gpus > 1
            else None
        )
        predictor = (
            f"predict --engine {fp.predict_engine} on {name}, evidence: {pred.evidence.tables}"
        )
    return Expectation(
        prediction=pred,
        model=_model_info(served, gguf.path, pred),
        note=note,
        assumptions=list(pred.assumptions),
        predictor=predictor,
    )


def _model_info(served: str | None, model_dir: str, pred: Prediction) -> ModelInfo:
    """The served model, with the footprint the CPU floors report (doctor.json's keys)."""
    d, m = pred.details, pred.model
    cpu = pred.kind == "cpu-floors"
    return ModelInfo(
        name=served,
        path=model_dir,
        summary=m.line(),
        weight_bytes=m.weight_bytes if cpu else None,
        params=d.params if cpu else None,
        layers=m.layers if cpu else None,
        hidden_size=m.hidden_size if cpu else None,
        kv_bytes_per_token=d.kv_bytes_per_token if cpu else None,
        dtype=d.dtype if cpu else None,
        source=d.source if cpu else None,
    )


def at_concurrency(cfg: DoctorConfig, pred: Prediction, concurrency: int) -> Prediction | None:
    """The same configuration at ``concurrency`` streams and the concurrency sweep's context,
    without the what-ifs (None when predict cannot run it)."""
    req = pred.request.model_copy(
        update={"batch": concurrency, "context": cfg.concurrency_context, "what_if": False}
    )
    try:
        return predict(req)
    except CeilingError:
        return None
