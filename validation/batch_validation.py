"""The batch curve scored on measured serving records (never fitted to them).

``experiments/validation/predict_batch_curve.py`` runs it. The rows are aiconfigurator-core's own
end-to-end measurements (``tables.silicon``: vLLM, SGLang and TensorRT-LLM on H100/H200/B200/
B300/GB200, concurrency 1-512, TPOT measured); each is mapped onto predict's catalog by
``data/predict/silicon_map.yaml`` (model path, system and quant mode only) and predicted at its
concurrency, its layout (TP, MoE EP) and context = input + output / 2 (the mean KV length while
decoding). Scored like the single-stream rows: per-user tok/s = 1000 / TPOT, error in speed
terms (+ = predicted faster), numpy's percentiles. Rows predict cannot express yet (attention
data parallel, pipeline parallel, a model or system outside the catalog) are skipped with the
reason. All of them are held out: none was scored before this module, and nothing in predict was
derived from them (its priors and tables are per-kernel measurements).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from pydantic import BaseModel

from ceiling.errors import CeilingError
from ceiling.predict.core import predict_one
from ceiling.predict.schema import PredictRequest
from ceiling.spec._data import DataModel, load_yaml
from validation.calibration import percentile, speed_error_pct
from validation.silicon import SiliconRecord, silicon_records


class ModelMap(DataModel):
    model: str
    native: list[str]


class SiliconMap(DataModel):
    """``data/predict/silicon_map.yaml``."""

    models: dict[str, ModelMap]
    formats: dict[str, str]
    systems: dict[str, str]


class BatchRow(BaseModel):
    id: str
    backend: str
    system: str
    model: str
    concurrency: int
    measured_tok_s_per_user: float
    expected_tok_s_per_user: float
    bound_tok_s_per_user: float
    error_pct: float
    tightness: float


class BatchStats(BaseModel):
    """|error| (and the signed median) over a set of rows; None: no rows."""

    n: int
    median_abs_error_pct: float | None
    p90_abs_error_pct: float | None
    median_signed_error_pct: float | None
    bound_violations: int
    median_tightness: float | None


class BatchReport(BaseModel):
    """The batch curve scored (``evaluate``); its JSON is the recorded result's
    (``experiments/validation/predict_batch_curve.py --out``)."""

    records: int
    scored: list[BatchRow]
    skipped: dict[str, int]  # why -> how many records, most first
    all: BatchStats
    by_concurrency: dict[str, BatchStats]  # "1", "2-4", "5-16", "17-64", ">64"
    by_backend: dict[str, BatchStats]
    by_system: dict[str, BatchStats]
    bound_violations: list[str]


def _map() -> SiliconMap:
    return load_yaml("predict/silicon_map.yaml", schema=SiliconMap)


def request_for(
    rec: SiliconRecord, attention_dp: bool = False
) -> tuple[PredictRequest | None, str]:
    """The request a record describes, or None and why predict cannot express it yet.
    ``attention_dp``: the records with data-parallel attention (and EP MoE) instead, mapped to
    ``--dp`` ranks of ``--tp`` each with the record's per-rank batch (the records' batch_size
    is per DP rank: c512 at DP 4 is batch 128)."""
    m = _map()
    model = m.models.get(rec.model_path)
    gpu = m.systems.get(rec.system)
    if model is None:
        return None, f"model {rec.model_path} not mapped"
    if gpu is None:
        return None, f"system {rec.system} not in the catalog"
    if rec.backend not in ("vllm", "sglang", "trtllm"):
        return None, f"engine {rec.backend} not predicted"
    if rec.pp > 1:
        return None, "pipeline parallel (latency only in predict)"
    dp = rec.attention_dp
    if (dp > 1) != attention_dp:
        return None, "attention data parallel (scored apart)" if dp > 1 else "no attention DP"
    if rec.moe_tp * rec.moe_ep not in (1, rec.tp * dp):
        return None, f"MoE TP {rec.moe_tp} x EP {rec.moe_ep} != TP {rec.tp} x DP {dp}"
    quant = rec.moe_quant_mode if rec.moe_quant_mode else rec.gemm_quant_mode
    fmt = None if quant in model.native else m.formats.get(quant)
    if quant not in model.native and fmt is None:
        return None, f"quant mode {quant} not mapped"
    req = PredictRequest(
        model=model.model,
        gpu=gpu,
        gpus=rec.tp * dp,
        tp=rec.tp,
        dp=dp,
        ep=rec.moe_ep if rec.moe_ep > 1 else 1,
        engine=rec.backend,
        batch=rec.concurrency,
        context=rec.isl + rec.osl // 2,
        weight_format=fmt,
    )
    return req, ""


def evaluate(
    max_concurrency: int = 64, per_group: int | None = None, attention_dp: bool = False
) -> BatchReport:
    """Every record at concurrency <= ``max_concurrency`` (or the first ``per_group`` of each
    model x system x engine, in file order: the tests' sample): scored rows, skipped reasons,
    stats overall, per concurrency, per backend and per system."""
    rows: list[BatchRow] = []
    skipped: dict[str, int] = defaultdict(int)
    # the concurrency a user sees: all DP ranks' sequences together
    recs = [r for r in silicon_records() if r.concurrency * r.attention_dp <= max_concurrency]
    if per_group:
        seen: dict[tuple[str, str, str], int] = defaultdict(int)
        sample = []
        for r in recs:
            key = (r.model_path, r.system, r.backend)
            if seen[key] < per_group:
                seen[key] += 1
                sample.append(r)
        recs = sample
    for rec in recs:
        req, why = request_for(rec, attention_dp)
        if req is None:
            skipped[why] += 1
            continue
        try:
            p = predict_one(req, curve=False, strict=False)
        except CeilingError as err:
            skipped[f"cannot model: {err.message[:80]}"] += 1
            continue
        assert p.bound is not None
        meas = 1000.0 / rec.tpot_ms
        rows.append(
            BatchRow(
                id=rec.id,
                backend=rec.backend,
                system=rec.system,
                model=rec.model_path,
                concurrency=rec.concurrency * rec.attention_dp,
                measured_tok_s_per_user=round(meas, 2),
                expected_tok_s_per_user=p.decode_tok_s_per_stream,
                bound_tok_s_per_user=p.bound.decode_tok_s_per_stream,
                error_pct=round(speed_error_pct("tok_s", meas, p.decode_tok_s_per_stream), 1),
                tightness=round(p.bound.decode_tok_s_per_stream / meas, 2),
            )
        )
    return BatchReport(
        records=len(recs),
        scored=rows,
        skipped=dict(sorted(skipped.items(), key=lambda kv: -kv[1])),
        all=_stats(rows),
        by_concurrency=_by(rows, lambda r: _bucket(r.concurrency)),
        by_backend=_by(rows, lambda r: r.backend),
        by_system=_by(rows, lambda r: r.system),
        bound_violations=[r.id for r in rows if r.tightness < 1.0],
    )


def _bucket(c: int) -> str:
    for hi, name in ((1, "1"), (4, "2-4"), (16, "5-16"), (64, "17-64")):
        if c <= hi:
            return name
    return ">64"


def _stats(rows: list[BatchRow]) -> BatchStats:
    errs = [abs(r.error_pct) for r in rows]
    signed = [r.error_pct for r in rows]
    return BatchStats(
        n=len(rows),
        median_abs_error_pct=round(percentile(errs, 50), 1) if rows else None,
        p90_abs_error_pct=round(percentile(errs, 90), 1) if rows else None,
        median_signed_error_pct=round(percentile(signed, 50), 1) if rows else None,
        bound_violations=sum(r.tightness < 1.0 for r in rows),
        median_tightness=round(percentile([r.tightness for r in rows], 50), 2) if rows else None,
    )


def _by(rows: list[BatchRow], key: Callable[[BatchRow], str]) -> dict[str, BatchStats]:
    groups: dict[str, list[BatchRow]] = defaultdict(list)
    for r in rows:
        groups[key(r)].append(r)
    return {k: _stats(v) for k, v in sorted(groups.items())}
