"""The evidence ladder, once: its order, confidences and fallbacks come from
``data/predict/evidence.yaml`` and every op kind climbs it through :func:`climb`.

An op kind supplies one lookup per source (``profile``, ``table``, ``prior``); ``climb`` asks
them in the ladder's order and returns the first answer. ``prior`` always answers. ``trace`` is
the top rung: ``predict.trace_evidence`` applies it over the whole step (one trace entry can
time a group of ops), so an op kind has no per-op lookup for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import Literal

from pydantic import Field, field_validator

from ceiling.predict.opspec import OpTime
from ceiling.spec._data import DataModel, load_yaml

Source = Literal["trace", "profile", "table", "prior"]


class ExactOrNear(DataModel):
    exact: float
    near: float

    def of(self, exact: bool) -> float:
        return self.exact if exact else self.near


class ProfileConfidence(DataModel):
    kernel: float
    elementwise: float
    launch_figure: float
    collective: float


class TableConfidence(DataModel):
    gemm: ExactOrNear
    moe: ExactOrNear
    attention: ExactOrNear
    collective: float


class PriorConfidence(DataModel):
    own_class: float
    borrowed_class: float
    generic: float
    elementwise: float
    pytorch: float
    link_allreduce: float
    link_other: float


class EngineConfidence(DataModel):
    measured: float
    estimate: float


class Confidence(DataModel):
    trace: float
    profile: ProfileConfidence
    table: TableConfidence
    prior: PriorConfidence
    engine: EngineConfidence


class Fallback(DataModel):
    t0_us: float
    eff: float


class TableCheck(DataModel):
    max_ratio: float
    min_excess_us: float


class Ladder(DataModel):
    """``data/predict/evidence.yaml``."""

    schema_version: int
    ladder: list[Source] = Field(min_length=2)

    @field_validator("ladder")
    @classmethod
    def _prior_answers(cls, v: list[Source]) -> list[Source]:
        if "prior" not in v or len(set(v)) != len(v):
            raise ValueError("each source once, `prior` among them (it answers every op)")
        if "trace" in v and v[0] != "trace":
            # predict.trace_evidence applies a trace over the whole step, above what every op
            # climbed to: a ladder that ranks it lower would say what the code does not do
            raise ValueError("`trace` is the top rung (applied over the step), listed first")
        return v

    confidence: Confidence
    fallback: Fallback
    table_check: TableCheck
    borrow: dict[str, list[str]]


@cache
def ladder() -> Ladder:
    return load_yaml("predict/evidence.yaml", schema=Ladder)


Lookup = Callable[[], OpTime | None]


def climb(lookups: Mapping[Source, Lookup]) -> OpTime:
    """The first answer in the ladder's order (``prior`` must answer)."""
    for source in ladder().ladder:
        lookup = lookups.get(source)
        if lookup is None:
            continue
        got = lookup()
        if got is not None:
            return got
    raise AssertionError("the prior rung answers every op")  # evidence.yaml lists `prior`
