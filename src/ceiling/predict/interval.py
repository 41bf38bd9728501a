"""The 80 % interval around ``expected``: how sure predict is, from the evidence of each op and
from what the model cannot express for the setup.

The step's log-error is taken as normal with spread

    sigma^2 = (sum over evidence levels of share x level spread)^2
              + (engine spread x (1 - trace share))^2
              + (spec decoding)^2 + (DP attention)^2 + (GPU vendor)^2

The engine term is what the engine's build does that predict does not model; a trace of this
engine has timed that build, so it shrinks by the trace's share of the step.

Levels (from each expected op's ``source`` and ``confidence``, the evidence ladder of
``data/predict/evidence.yaml``): ``trace``, ``profile``, ``table``, ``prior`` (this GPU class's),
``prior_borrowed`` (another class's prior, or the generic fallback: confidence <= 0.3) and
``engine`` (the host-time estimate). Ops of one level share their error (one prior table is off
for every GEMM together), so shares add linearly within the evidence term. The interval is
``expected x exp(+-z sigma)`` on the step (tok/s inverted).

The spreads are data (``data/predict/intervals.yaml``, :class:`IntervalsFile`), fitted by
``experiments/validation/calibrate_intervals.py`` leave-one-setup-out on the project's own
validation rows; its file records the coverage that procedure reached on the left-out setups.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Literal

from pydantic import BaseModel

from ceiling.errors import CeilingError
from ceiling.predict.schema import BatchPoint, Interval, Prediction
from ceiling.predict.validate import vendor_of
from ceiling.spec._data import DataModel, load_yaml
from ceiling.spec.hardware import load_gpu

Level = Literal["trace", "profile", "table", "prior", "prior_borrowed", "engine"]
LEVELS: tuple[Level, ...] = ("trace", "profile", "table", "prior", "prior_borrowed", "engine")
Factor = Literal["spec_decoding", "attention_dp", "gpu_vendor"]
# a prior at or below this confidence is another class's or the generic fallback (evidence.yaml:
# borrowed_class 0.3, generic 0.2; own_class 0.5, elementwise 0.4)
BORROWED_MAX_CONFIDENCE = 0.3
# what a level is called in the one-line reason
_WORDS = {
    "trace": "a trace",
    "profile": "a profile",
    "table": "tables",
    "prior": "priors",
    "prior_borrowed": "another GPU class's priors",
    "engine": "an estimate",
}


class Spread(DataModel):
    """One spread (log-space sigma) and where it came from."""

    sigma: float
    rows: float  # the rows' weight behind it (shares summed; 0: not calibrated)
    calibrated: bool
    how: str


class LooFigures(DataModel):
    """Leave-one-setup-out: each setup's rows scored by spreads fitted on the other setups."""

    setups: int
    rows: int
    coverage: float
    coverage_setup_weighted: float
    by_set: dict[str, float]  # coverage per row set
    rows_by_set: dict[str, int]
    median_width_pct: float  # (high - low) / expected, median over the left-out rows


class IntervalsFile(DataModel):
    """``data/predict/intervals.yaml``."""

    schema_version: int
    coverage: float
    z: float
    produced_by: str
    fitted_on: str
    levels: dict[Level, Spread]
    engines: dict[str, Spread]
    default_engine: Spread
    factors: dict[Factor, Spread]
    leave_one_setup_out: LooFigures


@cache
def intervals() -> IntervalsFile:
    return load_yaml("predict/intervals.yaml", schema=IntervalsFile)


class Features(BaseModel):
    """What sets a prediction's spread: its evidence shares and setup factors."""

    shares: dict[str, float]
    engine: str
    factors: list[str]
    gpu: str
    prior_ops: list[str]  # the op families from priors (the reason names them)


def level_of(source: str, confidence: float) -> Level:
    if source in ("trace", "profile", "table", "engine"):
        return source  # type: ignore[return-value]
    return "prior_borrowed" if confidence <= BORROWED_MAX_CONFIDENCE else "prior"


_FAMILY_WORDS = (
    ("moe", "MoE"),
    ("attn", "attention"),
    ("gemm", "GEMMs"),
    ("allreduce", "collectives"),
)


def _family(kernel: str, name: str) -> str | None:
    text = f"{kernel} {name}".lower()
    for key, word in _FAMILY_WORDS:
        if key in text:
            return word
    return None


def features(pred: Prediction) -> Features | None:
    """The evidence shares of ``expected`` and the setup factors (None: no expected block)."""
    exp = pred.expected
    if exp is None or not exp.ops:
        return None
    by: dict[str, float] = {}
    weak: dict[str, float] = {}
    for op in exp.ops:
        lvl = level_of(op.source, op.confidence)
        by[lvl] = by.get(lvl, 0.0) + max(op.ms, 0.0)
        fam = _family(op.kernel, op.name)
        if lvl in ("prior", "prior_borrowed") and fam:
            weak[fam] = weak.get(fam, 0.0) + op.ms
    total = sum(by.values()) or 1.0
    req, dep = pred.request, pred.deployment
    factors = []
    if req.spec != "none":
        factors.append("spec_decoding")
    if dep.dp > 1 and dep.ep > 1:
        factors.append("attention_dp")
    if _vendor(pred) != "nvidia":
        factors.append("gpu_vendor")
    return Features(
        shares={k: v / total for k, v in by.items()},
        engine=dep.engine,
        factors=factors,
        gpu=pred.hardware.gpu or "",
        prior_ops=[f for f, ms in sorted(weak.items(), key=lambda kv: -kv[1]) if ms > 0.05 * total],
    )


def _vendor(pred: Prediction) -> str:
    try:
        return vendor_of(load_gpu(pred.request.gpu_name()))
    except CeilingError:  # a GPU file gone since it was predicted: an unknown vendor
        return "unknown"


def sigma(f: Features, data: IntervalsFile | None = None) -> tuple[float, dict[str, float]]:
    """The spread and each term's part of its square (evidence, engine, each factor)."""
    d = data or intervals()
    ev = sum(share * d.levels[lvl].sigma for lvl, share in f.shares.items() if lvl in d.levels)
    # a trace of this engine timed its build's kernels: the engine term shrinks by its share
    eng = d.engines.get(f.engine, d.default_engine).sigma * (1.0 - f.shares.get("trace", 0.0))
    parts = {"evidence": ev**2, "engine": eng**2}
    for fac in f.factors:
        parts[fac] = d.factors[fac].sigma ** 2  # type: ignore[index]
    return math.sqrt(sum(parts.values())), parts


def reason(f: Features, parts: dict[str, float]) -> str:
    """One line: what widens the interval, largest part first."""
    bits = []
    weak = [lvl for lvl in ("prior_borrowed", "prior") if f.shares.get(lvl, 0) > 0.05]
    if weak:
        ops = " and ".join(f.prior_ops[:3]) or "most ops"
        bits.append(f"{ops} on {f.gpu} from {_WORDS[weak[0]]}")
    elif f.shares.get("table", 0) > 0.05:
        bits.append(f"kernels on {f.gpu} from tables")
    if not any(f.shares.get(lvl, 0) > 0.05 for lvl in ("trace", "profile")):
        bits.append("no measured profile")
    named = {
        "spec_decoding": "speculative decoding's acceptance",
        "attention_dp": "DP attention's imbalance",
        "gpu_vendor": "a GPU vendor no validation row covers",
    }
    for fac in sorted((k for k in parts if k in named), key=lambda k: -parts[k]):
        bits.append(named[fac])
    bits.append(f"{f.engine}'s build (engine term)")
    return "; ".join(bits)


def interval_of(step_ms: float, s: float, data: IntervalsFile | None = None) -> tuple[float, float]:
    """(low, high) step ms around ``step_ms`` for spread ``s``."""
    z = (data or intervals()).z
    return step_ms * math.exp(-z * s), step_ms * math.exp(z * s)


def attach(pred: Prediction) -> Prediction:
    """``pred`` with the interval on ``expected`` and on every batch-curve point (the same
    spread: the curve's evidence mix is the request's), in place."""
    f = features(pred)
    if f is None or pred.expected is None:
        return pred
    d = intervals()
    s, parts = sigma(f, d)
    lo, hi = interval_of(pred.decode_ms_per_token, s, d)
    pred.expected.interval = Interval(
        coverage=d.coverage,
        step_ms_low=round(lo, 4),
        step_ms_high=round(hi, 4),
        tok_s_low=round(1e3 / hi, 2),
        tok_s_high=round(1e3 / lo, 2),
        spread=round(s, 4),
        reason=reason(f, parts),
    )
    pred.batch_curve = [_point(pt, s, d) for pt in pred.batch_curve]
    return pred


def _point(pt: BatchPoint, s: float, d: IntervalsFile) -> BatchPoint:
    lo, hi = interval_of(pt.step_ms, s, d)
    return pt.model_copy(
        update={
            "step_ms_low": round(lo, 4),
            "step_ms_high": round(hi, 4),
            "tok_s_per_stream_low": round(1e3 / hi, 2),
            "tok_s_per_stream_high": round(1e3 / lo, 2),
        }
    )
