"""What the hardware allows for the deployment the doctor examines (its "expected" side).

Why a module of its own: the doctor's flow (``doctor.py``) only sequences stages; deciding what
the hardware is (probed GPUs, or this CPU measured on the spot), which model and configuration
to predict (TP and CUDA graphs from options, the engine log or the variant) and turning
predict's answer — or the CPU floors — into the result document lives here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ceiling.errors import CeilingError

if TYPE_CHECKING:
    from ceiling.diagnose.doctor import DoctorConfig, DoctorResult


def arg_value(variant: Any, *names: str) -> str | None:
    for a in getattr(variant, "args", []) or []:
        if a.flag.lstrip("-") in names:
            return a.values[0] if a.values else "true"
    return None


def describe_hardware(cfg: DoctorConfig, res: DoctorResult) -> Any:
    """Probe GPUs; on a machine without them, describe (and measure) the CPU."""
    from ceiling.probe.topology import probe

    topo = probe()
    if topo.gpus and not cfg.gpu:
        g = topo.gpus[0]
        res.hardware = {
            "kind": "gpu",
            "name": g.catalog_name or g.name,
            "gpus": len(topo.gpus),
            "link": topo.link_for([x.index for x in topo.gpus]),
            # peer-to-peer on every pair (None: not probed); findings check advice against it
            "p2p": None
            if not topo.pairs or any(p.p2p is None for p in topo.pairs)
            else all(p.p2p for p in topo.pairs),
            "description": f"{len(topo.gpus)} x {g.name}"
            + (
                f" (catalog: {g.catalog_name})"
                if g.catalog_name
                else " (not in the predict catalog: pass --gpu)"
            ),
        }
        return None
    if cfg.gpu:
        res.hardware = {
            "kind": "gpu",
            "name": cfg.gpu,
            "gpus": cfg.tp or 1,
            "link": None,
            "description": f"{cfg.gpu} (given with --gpu, not probed)",
        }
        return None
    from ceiling.diagnose.cpu_host import describe_cpu

    host = describe_cpu(measure=cfg.measure_cpu)
    res.hardware = {
        "kind": "cpu",
        "name": host.name,
        "cores": host.cores,
        "mem_bw_GBps": host.mem_bw_GBps,
        "gflops": host.gflops,
        "measured": host.measured,
        "source": host.source,
        "description": host.description,
        "gpu_probe": topo.reason or "no NVIDIA GPU found",
    }
    if not host.measured:
        res.assumptions.append(f"CPU rates are assumed, not measured: {host.source}")
    return host


def find_model_dir(cfg: DoctorConfig, variant: Any, models: list[dict[str, Any]]) -> str | None:
    if cfg.model_path:
        return cfg.model_path
    if variant is not None and variant.model_path() is not None:
        return str(variant.model_path())
    for m in models:
        root = m.get("root")
        if root and Path(root).exists():
            return str(root)
    return models[0].get("root") if models else None


def predict_gpu(
    cfg: DoctorConfig,
    res: DoctorResult,
    model: str,
    variant: Any,
    batch: int = 1,
    what_if: bool = True,
) -> dict[str, Any]:
    from ceiling.predict.api import PredictRequest, predict

    facts = res.facts or {}
    tp = (
        cfg.tp
        or facts.get("tensor_parallel_size")
        or int(arg_value(variant, "tensor-parallel-size", "tp") or 1)
    )
    graphs = cfg.cuda_graphs
    if graphs is None and facts.get("enforce_eager") is not None:
        graphs = not facts["enforce_eager"] and facts.get("cudagraph_mode") not in ("NONE",)
    if graphs is None:
        graphs = arg_value(variant, "enforce-eager") not in ("true", "True", "1")
    req = PredictRequest(
        model=model,
        gpu=res.hardware["name"],
        tp=tp,
        gpus=max(tp, 1),
        link=res.hardware.get("link"),
        engine=(cfg.engine or "vllm")
        if (cfg.engine or "vllm") in ("vllm", "sglang", "trtllm")
        else "generic",
        cuda_graphs=graphs,
        batch=batch,
        context=cfg.input_len + cfg.max_tokens // 2,
        prompt_len=cfg.input_len,
        what_if=what_if,
    )
    return predict(req).model_dump(mode="json")


def model_summary(m: dict[str, Any]) -> str:
    """One line from predict's model dict (catalog name, size, format)."""
    parts = [
        str(m.get("name") or "?"),
        f"{m.get('architecture')}" if m.get("architecture") else "",
        f"{m.get('layers')} layers" if m.get("layers") else "",
        f"{m.get('total_params_B')} B params" if m.get("total_params_B") else "",
        f"{m.get('active_params_B')} B active" if m.get("experts") else "",
        str(m.get("quantization") or ""),
        f"{m.get('weight_GB')} GB of weights" if m.get("weight_GB") else "",
    ]
    return ", ".join(p for p in parts if p)


def predict_cpu(
    cfg: DoctorConfig, res: DoctorResult, host: Any, model_dir: str | None, served: str | None
) -> Any:
    """The CPU 'prediction': the model's bytes and FLOPs at this CPU's rates (floors only)."""
    from ceiling.diagnose.cpu_host import cpu_floor_components, model_footprint

    if model_dir is None:
        raise CeilingError("cannot find the model's files", fix="pass --model-path")
    footprint = model_footprint(model_dir)
    res.model = {
        "name": served,
        "path": model_dir,
        "summary": footprint.summary,
        **footprint.model_dump(),
    }
    ctx = cfg.input_len + cfg.max_tokens // 2
    res.prediction_note = (
        "the predict catalog describes GPUs; on this CPU the floors are the model's bytes and "
        f"FLOPs at this CPU's {'measured' if host.measured else 'ASSUMED'} rates; launch/host "
        "components are not predicted, so they appear in the unexplained remainder"
    )
    res.prediction = {
        "kind": "cpu-floors",
        "components_ms": cpu_floor_components(footprint, host, batch=1, context=ctx),
        "batch": 1,
        "context": ctx,
        "what_if": [],
    }
    res.assumptions.append(
        f"weights are read once per decode step at their on-disk size "
        f"({footprint.weight_bytes / 1e6:.3g} MB, {footprint.dtype})"
    )
    res.assumptions.append(
        f"mean decode context {ctx} tokens (prompt {cfg.input_len} + half of "
        f"{cfg.max_tokens} generated)"
    )
    return footprint
