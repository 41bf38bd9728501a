"""Service-level objectives, goodput and the reported percentiles of ``ceiling bench``.

An SLO is written ``METRIC:STAT<=VALUE UNIT`` (``ttft:p99<=500ms``, ``itl:p90<=50ms``,
``e2el:mean<=2s``), several separated by commas. It is judged twice:

- **per level**: the level's statistic (the summary key it names, ``p99_ttft_ms``, as
  ``vllm bench serve`` names it) against the threshold: ``SloCheck.met``;
- **per request**, for goodput: a completed request meets an SLO when *its own* value is at or
  under the threshold (whatever the statistic): its TTFT, TTFCT, E2E latency, TPOT, or the mean
  of its inter-chunk gaps for ``itl``. As ``vllm bench serve --goodput``: a request of one token
  has TPOT (and ITL) 0, so it meets those; a request without a value for TTFT/TTFCT/E2E (no
  content came) does not meet that SLO. Failed requests never count.

``request_goodput`` = completed requests that met every SLO / the level's duration (vLLM's key).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Literal, get_args

from pydantic import BaseModel, Field

from ceiling.bench.metrics import RequestRecord
from ceiling.errors import CeilingError

SloMetric = Literal["ttft", "ttfct", "tpot", "itl", "e2el"]
METRICS: tuple[str, ...] = get_args(SloMetric)
#: The percentiles a summary reports when --percentiles is not given.
DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0)

_UNIT_MS = {"ms": 1.0, "s": 1000.0, "us": 0.001}
_EXAMPLE = "e.g. --slo ttft:p99<=500ms,itl:p90<=50ms"
_ITEM = re.compile(
    r"^(?P<metric>[a-z0-9_]+):(?P<stat>[a-z0-9_.]+)(?P<op><=|>=|<|>|=+)(?P<rest>.*)$"
)
_VALUE = re.compile(r"^(?P<num>[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)(?P<unit>[a-z]*)$")


def p_word(p: float) -> str:
    """A percentile as a key word, as ``vllm bench serve`` writes it: 99 -> '99', 99.9 -> '99.9'."""
    return str(int(p)) if int(p) == p else str(p)


class Slo(BaseModel):
    """One objective: ``stat`` of ``metric`` at most ``threshold_ms``."""

    metric: SloMetric
    stat: str = Field(description="p<N> (a percentile), mean or median")
    threshold_ms: float = Field(gt=0, allow_inf_nan=False)

    @property
    def key(self) -> str:
        """The summary key the level's value is read from (``p99_ttft_ms``)."""
        return f"{self.stat}_{self.metric}_ms"

    @property
    def percentile(self) -> float | None:
        return float(self.stat[1:]) if self.stat.startswith("p") else None

    @property
    def text(self) -> str:
        return f"{self.metric}:{self.stat}<={self.threshold_ms:g}ms"


class SloCheck(BaseModel):
    """One SLO judged on one level: the level's statistic, and the requests that missed it."""

    slo: str = Field(description="the objective as written back: ttft:p99<=500ms")
    metric: SloMetric
    stat: str
    threshold_ms: float
    value_ms: float | None = Field(description="the level's statistic (None: no sample)")
    met: bool = Field(description="value_ms <= threshold_ms")
    missed_requests: int = Field(description="completed requests whose own value exceeded it")


def _percentile(text: str, where: str) -> float:
    try:
        p = float(text)
    except ValueError:
        p = math.nan
    if not (math.isfinite(p) and 0 < p <= 100):
        raise CeilingError(
            f"bad percentile {text!r} in {where}: a percentile is a number in (0, 100]",
            fix="e.g. p99 or p99.9 (--slo), 50,90,99 (--percentiles)",
        )
    return p


def parse_percentiles(text: str) -> list[float]:
    """``--percentiles 50,90,99.9`` -> [50.0, 90.0, 99.9] (sorted, no duplicates)."""
    items = [x.strip().lower().removeprefix("p") for x in text.split(",")]
    if not text.strip() or any(not x for x in items):
        raise CeilingError(
            f"bad --percentiles {text!r}: an empty item", fix="e.g. --percentiles 50,90,99"
        )
    return sorted({_percentile(x, "--percentiles") for x in items})


def _parse_one(item: str) -> Slo:
    low = item.replace(" ", "").lower()
    m = _ITEM.match(low)
    if m is None:
        raise CeilingError(f"bad SLO {item!r}: write METRIC:STAT<=VALUE with a unit", fix=_EXAMPLE)
    metric, stat, op, rest = m["metric"], m["stat"], m["op"], m["rest"]
    if metric not in METRICS:
        raise CeilingError(
            f"bad SLO {item!r}: no metric {metric!r}",
            fix="use one of " + ", ".join(METRICS) + f" ({_EXAMPLE})",
        )
    if stat in ("mean", "median"):
        pass
    elif stat.startswith("p"):
        stat = "p" + p_word(_percentile(stat[1:], f"SLO {item!r}"))
    else:
        raise CeilingError(
            f"bad SLO {item!r}: no statistic {stat!r}",
            fix=f"use p<N> (p99, p99.9), mean or median ({_EXAMPLE})",
        )
    if op != "<=":
        # every metric here is a latency: an objective is a ceiling, never a floor
        raise CeilingError(
            f"bad SLO {item!r}: {op!r} is not an objective a latency can have",
            fix=f"write <= (at most): {metric}:{stat}<=VALUE",
        )
    v = _VALUE.match(rest)
    if v is None:
        raise CeilingError(f"bad SLO {item!r}: {rest!r} is not a time", fix="e.g. 500ms, 2s, 800us")
    if not v["unit"]:
        raise CeilingError(
            f"bad SLO {item!r}: {v['num']} has no unit", fix=f"write {v['num']}ms (or s, us)"
        )
    if v["unit"] not in _UNIT_MS:
        raise CeilingError(f"bad SLO {item!r}: unknown unit {v['unit']!r}", fix="use ms, s or us")
    threshold = float(v["num"]) * _UNIT_MS[v["unit"]]
    if threshold <= 0:
        raise CeilingError(f"bad SLO {item!r}: the threshold must be above 0", fix=_EXAMPLE)
    return Slo.model_validate({"metric": metric, "stat": stat, "threshold_ms": threshold})


def parse_slos(text: str | None) -> list[Slo]:
    """``--slo ttft:p99<=500ms,itl:p90<=50ms`` -> typed SLOs; CeilingError naming the item."""
    if text is None:
        return []
    items = text.split(",")
    if not text.strip() or any(not x.strip() for x in items):
        raise CeilingError(f"bad --slo {text!r}: an empty item", fix=_EXAMPLE)
    out: list[Slo] = []
    for item in items:
        slo = _parse_one(item.strip())
        if any(s.key == slo.key for s in out):
            raise CeilingError(
                f"bad --slo {text!r}: two objectives for {slo.metric}:{slo.stat}",
                fix="give each METRIC:STAT once",
            )
        out.append(slo)
    return out


def percentiles_for(chosen: Sequence[float], slos: Iterable[Slo]) -> list[float]:
    """The percentiles a summary computes: the chosen ones and every one an SLO reads."""
    extra = [p for s in slos if (p := s.percentile) is not None]
    return sorted({*chosen, *extra})


def request_value(r: RequestRecord, metric: str) -> float | None:
    """The request's own value of ``metric`` (ms) for the per-request rule (module docstring)."""
    if metric == "tpot":
        return r.tpot_ms if r.tpot_ms is not None else 0.0
    if metric == "itl":
        return sum(r.itl_ms) / len(r.itl_ms) if r.itl_ms else 0.0
    return {"ttft": r.ttft_ms, "ttfct": r.ttfct_ms, "e2el": r.e2el_ms}[metric]


def _meets(r: RequestRecord, slo: Slo) -> bool:
    v = request_value(r, slo.metric)
    return v is not None and v <= slo.threshold_ms


def goodput(
    records: Sequence[RequestRecord], slos: Sequence[Slo], duration_s: float
) -> tuple[int, float | None]:
    """(completed requests that met every SLO, those per second of ``duration_s``)."""
    good = sum(1 for r in records if r.ok and all(_meets(r, s) for s in slos))
    return good, (good / duration_s if duration_s > 0 else None)


def checks(
    summary: dict[str, object], records: Sequence[RequestRecord], slos: Sequence[Slo]
) -> list[SloCheck]:
    """Each SLO on one level: its statistic from ``summary`` and the requests that missed it."""
    ok = [r for r in records if r.ok]
    out = []
    for s in slos:
        raw = summary.get(s.key)
        value = float(raw) if isinstance(raw, int | float) else None
        out.append(
            SloCheck(
                slo=s.text,
                metric=s.metric,
                stat=s.stat,
                threshold_ms=s.threshold_ms,
                value_ms=value,
                met=value is not None and value <= s.threshold_ms,
                missed_requests=sum(1 for r in ok if not _meets(r, s)),
            )
        )
    return out
