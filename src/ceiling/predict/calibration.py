"""Map published decode measurements (decode_calibration.csv) onto predictions.

Used by ``bench/predict_accuracy.py`` (prints the error table) and by the tests (tolerances).
Each row is turned into a :class:`PredictRequest` from its columns; rows the model cannot
describe (speculative decoding, checkpoints without a config) are skipped with a reason.
``fraction_of_ceiling`` is measured throughput / predicted throughput (or predicted latency /
measured latency): a prediction is a ceiling, so it should be <= 1 up to the model's error.
"""

from __future__ import annotations

import csv
import statistics
from importlib import resources
from pathlib import Path
from typing import Any

from ceiling.errors import CeilingError
from ceiling.predict.api import PredictRequest, _core

LATENCY_METRICS = {"tpot_ms", "e2e_batch_latency_s"}

# model column -> (catalog model, --weight-format override or None, note)
MODELS: dict[str, tuple[str, str | None, str]] = {
    "lukealonso/Qwen3.5-397B-A17B-NVFP4": (
        "qwen3.5-397b-a17b-nvfp4",
        None,
        "nvidia NVFP4 config used as proxy for lukealonso's NVFP4",
    ),
    "nvidia/Qwen3.5-397B-A17B-NVFP4": ("qwen3.5-397b-a17b-nvfp4", None, ""),
    "QuantTrio/Qwen3.5-397B-A17B-AWQ": ("qwen3.5-397b-a17b", "awq", "AWQ g128 on all linears"),
    "lukealonso/MiniMax-M2.5-NVFP4": ("minimax-m2.5", "nvfp4", "NVFP4 on all linears"),
    "mratsim/Minimax-M2.5-BF16-INT4-AWQ": ("minimax-m2.5", "awq", "AWQ g128 on all linears"),
    "MiniMaxAI/MiniMax-M2.5": ("minimax-m2.5", None, ""),
}
GPUS = {"RTX PRO 6000": "rtx-pro-6000", "A100": "a100-80"}


def _gpu(text: str) -> str | None:
    for key, name in GPUS.items():
        if key in text:
            return name
    return None


def _link(row: dict[str, str]) -> str:
    ic = row["interconnect"].lower()
    if "nvlink" in ic:
        return "nvlink3"
    return "pcie5-switch"


def _context(text: str) -> int:
    t = text.lower()
    if "131072" in t or "128k" in t:
        return 131072
    return 1024  # "0 (short prompt)", "low ctx", "not stated": a short chat-length context


def _kv(text: str) -> str:
    return "fp8" if "fp8" in text.lower() else "auto"


def _model_for(row: dict[str, str]) -> tuple[str, str | None, str] | None:
    m = row["model"]
    for key, val in MODELS.items():
        if m.startswith(key):
            return val
    if m.startswith("Llama 70B"):
        return ("llama-3.1-70b", None, "Llama-2-70B era: Llama-3.1-70B shape used (vocab differs)")
    return None


def model_row(row: dict[str, str]) -> tuple[float | None, str]:
    """Predicted value of the row's metric, or (None, why it is skipped)."""
    if row["spec_decode"].strip().lower() not in ("none", ""):
        return None, "speculative decoding (MTP) is not modelled"
    mm = _model_for(row)
    if mm is None:
        return None, f"no config for {row['model']} (pruned/unknown checkpoint)"
    gpu = _gpu(row["gpu"])
    if gpu is None:
        return None, f"GPU not in catalog: {row['gpu']}"
    model, fmt, _note = mm
    engine = row["engine"] if row["engine"] in ("vllm", "sglang", "trtllm") else "generic"
    notes = row["notes"].lower()
    allreduce = "oneshot" if "oneshot" in notes or "custom allreduce" in notes else "auto"
    if "nccl allreduce (before custom ar)" in notes:
        allreduce = "nccl"
    metric = row["metric"]
    conc = int(row["concurrency"])
    tp, ep, pp = int(row["tp"]), int(row["ep"]), int(row["pp"])
    req = PredictRequest(
        model=model,
        gpu=gpu,
        gpus=int(row["num_gpus"]),
        link=_link(row),
        tp=tp,
        ep=ep,
        pp=pp,
        engine=engine,
        allreduce=allreduce,
        batch=conc,
        context=_context(row["input_len"]),
        kv_dtype=_kv(row["kv_cache_dtype"]),
        weight_format=fmt,
    )
    try:
        if metric == "e2e_batch_latency_s":
            # batch of `conc` prompts of input_len, then output_len decode steps (ctx grows)
            inp, out = int(row["input_len"]), int(row["output_len"])
            req = req.model_copy(update={"context": inp + out // 2, "prompt_len": inp * conc})
            p = _core(req, strict=False)
            return (p.prefill["prefill_ms"] + out * p.decode_ms_per_token) / 1e3, ""
        p = _core(req, curve=False, strict=False)
    except CeilingError as err:
        return None, f"cannot model: {err.message}"
    if metric == "decode_tok_s_per_stream":
        return p.decode_tok_s_per_stream, ""
    if metric == "aggregate_output_tok_s":
        return p.aggregate_tok_s, ""
    if metric == "tpot_ms":
        return p.decode_ms_per_token, ""
    return None, f"metric {metric} not modelled"


def default_csv() -> Path:
    return Path(
        str(
            resources.files("ceiling") / "data" / "predict" / "reference" / "decode_calibration.csv"
        )
    )


def evaluate(path: Path) -> dict[str, Any]:
    rows = list(csv.DictReader(path.open()))
    modelled, skipped = [], []
    for row in rows:
        pred, why = model_row(row)
        if pred is None:
            skipped.append({"id": row["id"], "why": why})
            continue
        meas = float(row["value"])
        err = (pred - meas) / meas * 100
        frac = pred / meas if row["metric"] in LATENCY_METRICS else meas / pred
        modelled.append(
            {
                "id": row["id"],
                "metric": row["metric"],
                "concurrency": int(row["concurrency"]),
                "measured": meas,
                "predicted": round(pred, 2),
                "error_pct": round(err, 1),
                "fraction_of_ceiling": round(frac, 3),
            }
        )
    abs_err = [abs(m["error_pct"]) for m in modelled]
    return {
        "rows": len(rows),
        "modelled": modelled,
        "skipped": skipped,
        "median_abs_error_pct": round(statistics.median(abs_err), 1) if abs_err else None,
        "max_abs_error_pct": round(max(abs_err), 1) if abs_err else None,
        "median_fraction_of_ceiling": round(
            statistics.median(m["fraction_of_ceiling"] for m in modelled), 3
        )
        if modelled
        else None,
    }
