"""Validate predict against published decode measurements (never fitted to them).

Sources (``data/predict/reference/``):
- ``decode_calibration.csv`` — the project's shared published runs (shared/data);
- ``decode_validation.csv`` — more published single-stream runs, each with its source and the
  catalog names it maps to (``ceiling_model``, ``ceiling_gpu``, ``link``...); ``use`` = ``all``
  (counts for the error figures and the bound) or ``bound`` (a configuration predict does not
  model — decode context parallel, forked kernels, overclocked memory — checked against the
  bound only);
- ``whatif_pairs.csv`` — measured before/after pairs (one knob changed on one box).

For every row: ``expected`` and ``bound`` (both in the row's metric), the signed error of
``expected`` in speed terms whatever the metric (+ = predicted faster: tok/s rows
``expected / measured - 1``, ms and s rows ``measured / expected - 1``), and whether the
measurement beats the bound by more than 5 % (a violation: a bug in the bound, never in the
row). ``evaluate`` groups |error| by engine, GPU, weight format and MoE/dense (median and p90,
one percentile function: ``percentile``) and counts violations; ``pairs`` gives, for each pair,
the measured and predicted change in speed, the sign (right only when the predicted change has
the measured one's sign) and the gap in percentage points.

Honest accounting: every row carries ``added`` (date and commit) and ``seen`` (``yes`` when the
model was changed with the row's score in sight: added in a commit that also changed the model,
or named by a later model change; ``no`` when it was scored before any change made with it in
sight). ``evaluate`` reports the held-out rows (``seen: no``) apart from the rest.
"""

from __future__ import annotations

import csv
import functools
import math
from importlib import resources
from pathlib import Path

import numpy as np

from ceiling.errors import CeilingError
from ceiling.predict.api import Prediction, PredictRequest, load_spec, predict_one
from ceiling.predict.slack import SlackSplit, split_slack
from validation.calibration_report import (
    CalibrationReport,
    ErrorStats,
    PairResult,
    RowResult,
    SkippedRow,
    SpecDecoding,
)

LATENCY_METRICS = {"tpot_ms", "e2e_batch_latency_s"}
# a measurement faster than the bound at all is a bug in the bound (the bound is physics:
# bytes at the datasheet peak, FLOPs at the dense peak, the fastest collective)
VIOLATION_MARGIN = 0.0

# decode_calibration.csv model column -> (catalog model, --weight-format override or None)
MODELS: dict[str, tuple[str, str | None]] = {
    "lukealonso/Qwen3.5-397B-A17B-NVFP4": ("qwen3.5-397b-a17b-nvfp4", None),
    "nvidia/Qwen3.5-397B-A17B-NVFP4": ("qwen3.5-397b-a17b-nvfp4", None),
    "QuantTrio/Qwen3.5-397B-A17B-AWQ": ("qwen3.5-397b-a17b", "awq"),
    # the checkpoints' own schemes (experts only; attention stays BF16): reference/models/
    "lukealonso/MiniMax-M2.5-NVFP4": ("ref:minimax-m2.5-nvfp4", None),
    "mratsim/Minimax-M2.5-BF16-INT4-AWQ": ("ref:minimax-m2.5-awq", None),
    "MiniMaxAI/MiniMax-M2.5": ("minimax-m2.5", None),
}
GPUS = {"RTX PRO 6000": "rtx-pro-6000", "RTX 6000 Pro": "rtx-pro-6000", "A100": "a100-80"}


def reference_dir() -> Path:
    return Path(str(resources.files("ceiling") / "data" / "predict" / "reference"))


def model_ref(name: str) -> str:
    """A row's model: a catalog name, or ``ref:<dir>`` for a checkpoint config shipped under
    ``reference/models/`` (quantization schemes the catalog does not carry)."""
    if name.startswith("ref:"):
        return str(reference_dir() / "models" / name[4:])
    return name


def default_csv() -> Path:
    return reference_dir() / "decode_calibration.csv"


def validation_csvs() -> list[Path]:
    return [default_csv(), reference_dir() / "decode_validation.csv"]


# ----------------------------------------------------------------------------- row mapping


def _gpu(text: str) -> str | None:
    for key, name in GPUS.items():
        if key in text:
            return name
    return None


def _context(text: str) -> int:
    t = text.lower()
    if "131072" in t or "128k" in t:
        return 131072
    try:
        return max(int(t.split()[0]), 1)
    except (ValueError, IndexError):
        return 1024  # "not stated", "low ctx": a short chat-length context


def _kv(text: str, weight_quant: str = "") -> str:
    """The row's KV dtype: 'fp8' when it says so. The rtx6kpro throughput page's shared column
    reads 'auto (...; checkpoint ships FP8 KV scales for NVFP4)': fp8 for its NVFP4 rows only
    (its AWQ checkpoint ships no KV scales, so vLLM's auto is the model dtype)."""
    t = text.lower()
    if "fp8 kv scales for nvfp4" in t:
        return "fp8" if "nvfp4" in weight_quant.lower() else "auto"
    return "fp8" if "fp8" in t else "auto"


def _legacy_request(row: dict[str, str]) -> tuple[PredictRequest | None, str]:
    """decode_calibration.csv's free-text columns -> a request (or why it is skipped)."""
    m = row["model"]
    mm = next((v for k, v in MODELS.items() if m.startswith(k)), None)
    if mm is None and m.startswith("Llama 70B"):
        mm = ("llama-3.1-70b", None)
    if mm is None:
        return None, f"no config for {m} (pruned/unknown checkpoint)"
    gpu = _gpu(row["gpu"])
    if gpu is None:
        return None, f"GPU not in catalog: {row['gpu']}"
    notes = row["notes"].lower()
    allreduce = "oneshot" if "oneshot" in notes or "custom allreduce" in notes else "auto"
    if "nccl allreduce (before custom ar)" in notes:
        allreduce = "nccl"
    attn, moe = _backends_in_notes(row["notes"], row["engine"])
    req = PredictRequest(
        model=model_ref(mm[0]),
        gpu=gpu,
        gpus=int(row["num_gpus"]),
        link="nvlink3" if "nvlink" in row["interconnect"].lower() else "pcie5-switch",
        tp=int(row["tp"]),
        ep=int(row["ep"]),
        pp=int(row["pp"]),
        engine=row["engine"] if row["engine"] in ("vllm", "sglang", "trtllm") else "generic",
        allreduce=allreduce,
        batch=int(row["concurrency"]),
        context=_context(row["input_len"]),
        kv_dtype=_kv(row["kv_cache_dtype"], row.get("weight_quant", "")),
        weight_format=mm[1],
        attention_backend=attn,
        moe_backend=moe,
    )
    return req, ""


# kernels of a fork, not of any engine release: such rows check the bound only (as
# decode_validation.csv's `use: bound` rows)
FORK_KERNELS = ("b12x",)


def _legacy_use(row: dict[str, str]) -> str:
    notes = row.get("notes", "").lower()
    return "bound" if any(k in notes for k in FORK_KERNELS) else "all"


def _backends_in_notes(notes: str, engine: str) -> tuple[str | None, str | None]:
    """The attention / MoE backend a calibration row's notes name ('attention triton, MoE
    flashinfer_cutlass'), when the engine has it (a fork's backend, e.g. b12x, is not)."""
    import re

    from ceiling.predict.choices import known_backends

    out: list[str | None] = []
    for kind, pat in (("attention", r"attention (\w+)"), ("moe", r"moe (?:runner )?(\w+)")):
        m = re.search(pat, notes.lower())
        name = m.group(1) if m else None
        out.append(name if name in known_backends(engine, kind) else None)
    return out[0], out[1]


def _validation_request(row: dict[str, str]) -> tuple[PredictRequest | None, str]:
    """decode_validation.csv: explicit catalog names."""
    req = PredictRequest(
        model=model_ref(row["ceiling_model"]),
        gpu=row["ceiling_gpu"],
        gpus=int(row["num_gpus"]),
        link=row["link"] or None,
        tp=int(row["tp"]),
        ep=int(row["ep"] or 1),
        pp=int(row["pp"] or 1),
        engine=row["engine"],
        allreduce=row["allreduce"] or "auto",
        batch=int(row["concurrency"]),
        context=max(int(row["context"] or 1024), 1),
        kv_dtype=row["kv_dtype"] or "auto",
        weight_format=row["weight_format"] or None,
        mem_clock=float(row["mem_clock"]) if row.get("mem_clock") else None,
        power_limit=float(row["power_limit"]) if row.get("power_limit") else None,
        attention_backend=row.get("attention_backend") or None,
        moe_backend=row.get("moe_backend") or None,
        async_scheduling={"true": True, "false": False}.get(
            (row.get("async_scheduling") or "").lower()
        ),
        dcp=int(row.get("dcp") or 1),
    )
    return req, ""


def request_for(row: dict[str, str]) -> tuple[PredictRequest | None, str]:
    """The PredictRequest a published row describes, or None and why it is skipped."""
    req, why = _validation_request(row) if "ceiling_model" in row else _legacy_request(row)
    if req is None:
        return None, why
    spec = spec_decoding(row)
    return (req.model_copy(update=spec.model_dump(exclude_none=True)) if spec else req), ""


def spec_decoding(row: dict[str, str]) -> SpecDecoding | None:
    """The speculative decoding a row's ``spec_decode`` column names ('mtp
    (num_speculative_tokens=2)', SGLang's 'mtp NEXTN (steps=4, topk=1, draft=3)', 'eagle3 k=3'):
    its first word when that is a method (SGLang calls its MTP path 'EAGLE'), with the
    acceptance its notes report ('89.2% acceptance': a rate; 'acceptance length 3.52'); None
    for none. SGLang with topk 1 drafts ``steps`` tokens (it sets num_draft_tokens = steps + 1)."""
    import re

    text = row["spec_decode"].strip().lower()
    if text in ("none", ""):
        return None
    methods = ("eagle3", "eagle", "ngram", "mtp")
    first = text.split()[0]
    method = first if first in methods else next((m for m in methods if m in text), "mtp")
    k = re.search(r"(?:num_speculative_tokens|steps|k)\s*=\s*(\d+)", text)
    tokens = int(k.group(1)) if k else None
    notes = row.get("notes", "").lower()
    rate = re.search(r"(\d+(?:\.\d+)?)\s*% acceptance", notes)
    length = re.search(r"acceptance length (\d+(?:\.\d+)?)", notes)
    return SpecDecoding(
        spec=method,
        spec_tokens=tokens,
        spec_acceptance_rate=float(rate.group(1)) / 100 if rate else None,
        spec_acceptance_length=float(length.group(1)) if length else None,
    )


def _decode_step(req: PredictRequest) -> Prediction:
    """The decode-step prediction of a row, computed once per request and evidence state: the
    scores, the pairs and the evidence check all read it (a key of the request's JSON and
    whether the tables are in use, so a priors-only run never reads a cached table result)."""
    from ceiling.predict import tables

    return _decode_step_cached(req.model_dump_json(), tables.info() is not None)


@functools.lru_cache(maxsize=256)
def _decode_step_cached(req_json: str, _with_tables: bool) -> Prediction:
    return predict_one(PredictRequest.model_validate_json(req_json), curve=False, strict=False)


def predict_row(row: dict[str, str]) -> tuple[tuple[float, float] | None, str]:
    """(expected, bound) in the row's metric, or (None, why the row is skipped)."""
    req, why = request_for(row)
    if req is None:
        return None, why
    metric = row["metric"]
    try:
        if metric == "e2e_batch_latency_s":
            # batch of `conc` prompts of input_len, then output_len decode steps (ctx grows)
            inp, out = int(row["input_len"]), int(row["output_len"])
            req = req.model_copy(update={"context": inp + out // 2, "prompt_len": inp * req.batch})
            p = predict_one(req, strict=False)
            pre = p.prefill["prefill_ms"]
            return (
                (pre + out * p.decode_ms_per_token) / 1e3,
                (pre + out * p.bound.decode_ms_per_token) / 1e3,  # type: ignore[union-attr]
            ), ""
        p = _decode_step(req)
    except CeilingError as err:
        return None, f"cannot model: {err.message}"
    b = p.bound
    assert b is not None
    if metric == "decode_tok_s_per_stream":
        return (p.decode_tok_s_per_stream, b.decode_tok_s_per_stream), ""
    if metric == "aggregate_output_tok_s":
        k = req.batch * p.deployment.dp
        return (p.aggregate_tok_s, b.decode_tok_s_per_stream * k), ""
    if metric == "tpot_ms":
        return (p.decode_ms_per_token, b.decode_ms_per_token), ""
    return None, f"metric {metric} not modelled"


class EvidenceCheck(SlackSplit):
    """``slack.SlackSplit`` of one published single-stream row (``id``): can the per-op evidence
    behind ``expected`` be true in the step the row measured?"""

    id: str


def evidence_check(row: dict[str, str]) -> EvidenceCheck | None:
    """The check for one single-stream decode row (None for other rows and skipped ones)."""
    if row["metric"] not in ("decode_tok_s_per_stream", "tpot_ms") or row["concurrency"] != "1":
        return None
    req, _ = request_for(row)
    if req is None:
        return None
    try:
        p = _decode_step(req)
    except CeilingError:
        return None
    value = float(row["value"])
    split = split_slack(p, value if row["metric"] == "tpot_ms" else 1000.0 / value)
    return None if split is None else EvidenceCheck(id=row["id"], **split.model_dump())


def evidence_checks(paths: list[Path] | None = None) -> list[EvidenceCheck]:
    """``evidence_check`` over the scored single-stream rows of the validation files."""
    out = []
    for p in paths or validation_csvs():
        for row in csv.DictReader(p.open()):
            if (row.get("use") or _legacy_use(row)) != "all":
                continue
            chk = evidence_check(row)
            if chk is not None:
                out.append(chk)
    return out


def _fmt_label(req: PredictRequest) -> str:

    spec = load_spec(req.model, req.weight_format)
    fm = spec.formats()
    top = max(fm, key=lambda k: fm[k])
    for prefix, label in (("int4", "int4"), ("awq", "awq"), ("gptq", "gptq"), ("fp8", "fp8")):
        if top.startswith(prefix):
            return label
    return top


def evaluate(path: Path | list[Path] | None = None) -> CalibrationReport:
    """Every row of the validation files, scored; groups; bound violations."""
    paths = validation_csvs() if path is None else ([path] if isinstance(path, Path) else path)
    modelled: list[RowResult] = []
    skipped: list[SkippedRow] = []
    n_rows = 0
    for p in paths:
        for row in csv.DictReader(p.open()):
            n_rows += 1
            pred, why = predict_row(row)
            if pred is None:
                skipped.append(SkippedRow(id=row["id"], why=why))
                continue
            exp, bnd = pred
            meas = float(row["value"])
            req, _ = request_for(row)
            assert req is not None
            latency = row["metric"] in LATENCY_METRICS
            # margin: + when the measurement is slower than the bound (as physics requires)
            margin = (meas / bnd - 1) if latency else (bnd / meas - 1)

            modelled.append(
                RowResult(
                    id=row["id"],
                    file=p.name,
                    use=row.get("use") or _legacy_use(row),
                    metric=row["metric"],
                    concurrency=int(row["concurrency"]),
                    engine=req.engine,
                    gpu=req.gpu,
                    weight_format=_fmt_label(req),
                    moe=load_spec(req.model, req.weight_format).is_moe,
                    measured=meas,
                    expected=round(exp, 3),
                    bound=round(bnd, 3),
                    error_pct=round(speed_error_pct(row["metric"], meas, exp), 1),
                    bound_margin_pct=round(margin * 100, 1),
                    tightness=round(1 + margin, 2),
                    violation=margin < -VIOLATION_MARGIN,
                    held_out=is_held_out(row),
                    added=row.get("added", ""),
                    spec=req.spec,
                )
            )
    scored = [r for r in modelled if r.use == "all"]
    single = [r for r in scored if r.concurrency == 1]
    everything = _stats(scored)
    return CalibrationReport(
        rows=n_rows,
        modelled=modelled,
        skipped=skipped,
        single_stream=_stats(single),
        all_rows=everything,
        held_out_single_stream=_stats([r for r in single if r.held_out]),
        seen_single_stream=_stats([r for r in single if not r.held_out]),
        held_out_all_rows=_stats([r for r in scored if r.held_out]),
        held_out_ids=[r.id for r in modelled if r.held_out],
        held_out_batch=_stats([r for r in scored if r.held_out and r.concurrency > 1]),
        held_out_by_added=_held_out_sets(scored),
        no_spec_single_stream=_stats([r for r in single if r.spec == "none"]),
        spec_single_stream=_stats([r for r in single if r.spec != "none"]),
        by_group=_groups(single),
        bound_violations=[r.id for r in modelled if r.violation],
        median_abs_error_pct=everything.median_abs_error_pct,
        max_abs_error_pct=everything.max_abs_error_pct,
    )


def _held_out_sets(scored: list[RowResult]) -> dict[str, ErrorStats]:
    """Each held-out set (rows sharing an ``added`` stamp): its single-stream rows and all."""
    out: dict[str, ErrorStats] = {}
    for added in sorted({r.added for r in scored if r.held_out}):
        rows = [r for r in scored if r.held_out and r.added == added]
        out[f"{added} single"] = _stats([r for r in rows if r.concurrency == 1])
        out[f"{added} all"] = _stats(rows)
    return out


def percentile(xs: list[float], q: float) -> float:
    """The one percentile of the accuracy figures (and of the tests that guard them): numpy's
    default (linear interpolation between closest ranks); NaN for no values."""
    return float(np.percentile(xs, q)) if xs else math.nan


def speed_error_pct(metric: str, measured: float, expected: float) -> float:
    """Signed error of ``expected`` in speed terms (+ = predicted faster than measured), for
    rate metrics (tok/s) and time metrics (ms per token, s per batch) alike."""
    if metric in LATENCY_METRICS:
        return (measured / expected - 1) * 100
    return (expected / measured - 1) * 100


def speed(metric: str, value: float) -> float:
    """A row's value as a speed (higher is faster): time metrics inverted."""
    return 1.0 / value if metric in LATENCY_METRICS else value


def is_held_out(row: dict[str, str]) -> bool:
    """``seen: no``: scored before any model change made with the row in sight. A row without
    the column counts as seen (nothing proves it was held out)."""
    return (row.get("seen") or "yes").strip().lower() == "no"


def _stats(rows: list[RowResult]) -> ErrorStats:
    errs = [abs(r.error_pct) for r in rows]
    return ErrorStats(
        n=len(rows),
        median_abs_error_pct=round(percentile(errs, 50), 1) if errs else None,
        p90_abs_error_pct=round(percentile(errs, 90), 1) if errs else None,
        max_abs_error_pct=round(max(errs), 1) if errs else None,
        bound_violations=sum(r.violation for r in rows),
        median_tightness=round(percentile([r.tightness for r in rows], 50), 2) if rows else None,
    )


def _groups(rows: list[RowResult]) -> dict[str, ErrorStats]:
    out: dict[str, ErrorStats] = {}
    keys = {
        "engine": lambda r: r.engine,
        "gpu": lambda r: r.gpu,
        "format": lambda r: r.weight_format,
        "moe": lambda r: "moe" if r.moe else "dense",
        "spec": lambda r: r.spec,
    }
    for dim, key in keys.items():
        buckets: dict[str, list[RowResult]] = {}
        for r in rows:
            buckets.setdefault(key(r), []).append(r)
        for name, rs in sorted(buckets.items()):
            out[f"{dim}={name}"] = _stats(rs)
    return out


def pairs(path: Path | None = None) -> list[PairResult]:
    """Measured vs predicted change of each before/after pair (per-stream tok/s)."""
    path = path or reference_dir() / "whatif_pairs.csv"
    rows: dict[str, dict[str, str]] = {}
    for p in validation_csvs():
        for row in csv.DictReader(p.open()):
            rows[row["id"]] = row
    out = []
    for pr in csv.DictReader(path.open()):
        a, b = rows[pr["before"]], rows[pr["after"]]
        pa, why_a = predict_row(a)
        pb, why_b = predict_row(b)
        if pa is None or pb is None:
            out.append(PairResult.model_validate({**pr, "skipped": why_a or why_b}))
            continue
        # changes in speed (+ = faster after), whatever the rows' metric
        ma, mb = speed(a["metric"], float(a["value"])), speed(b["metric"], float(b["value"]))
        meas = (mb / ma - 1) * 100
        pred = (speed(b["metric"], pb[0]) / speed(a["metric"], pa[0]) - 1) * 100
        out.append(
            PairResult.model_validate(
                {
                    **pr,
                    "measured_delta_pct": round(meas, 1),
                    "predicted_delta_pct": round(pred, 1),
                    "right_sign": math.copysign(1, meas) == math.copysign(1, pred),
                    "held_out": is_held_out(pr) and is_held_out(a) and is_held_out(b),
                    "gap_points": round(abs(pred - meas), 1),
                    "within_5_points": abs(pred - meas) <= 5,
                }
            )
        )
    return out
