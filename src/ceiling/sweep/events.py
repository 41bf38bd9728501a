"""What a sweep trial reports as it runs: one event type per thing that happened, as a
discriminated union on ``type`` (the JSON key; ``type_`` in Python, as guidellm names it).

A trial (local, or a Ray worker) yields these; the sweep flow commits each to the ledger before
reading the next, dispatching on the event's class instead of a string. ``as_event`` also takes
the plain mapping of one (a trial written as a generator of dicts: tests, older workers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Launched(_Event):
    """The engine is up and serving."""

    type_: Literal["launched"] = Field("launched", alias="type")
    log_path: str | None = None
    url: str | None = None


class SanityPassed(_Event):
    """The output gate ran before the first repeat and did not find the output broken."""

    type_: Literal["sanity"] = Field("sanity", alias="type")
    sanity: dict[str, Any] = Field(description="the sanity report (JSON)")
    log_path: str | None = None


class Broken(_Event):
    """The output gate found the output broken: no repeat is measured."""

    type_: Literal["broken"] = Field("broken", alias="type")
    error: str
    sanity: dict[str, Any] | None = None
    log_path: str | None = None


class Repeat(_Event):
    """One measured repeat."""

    type_: Literal["repeat"] = Field("repeat", alias="type")
    idx: int
    tok_s: float | None = None
    result: dict[str, Any] = Field(default_factory=dict, description="the bench result (JSON)")
    result_path: str | None = None


class StoppedEarly(_Event):
    """Early stopping decided the variant (its samples already say enough)."""

    type_: Literal["stopped_early"] = Field("stopped_early", alias="type")
    reason: str


class Failed(_Event):
    """The trial failed (launch, a dead server, a worker): the sweep goes on."""

    type_: Literal["failed"] = Field("failed", alias="type")
    error: str
    log_path: str | None = None


class Done(_Event):
    """Every repeat ran."""

    type_: Literal["done"] = Field("done", alias="type")


TrialEvent = Annotated[
    Launched | SanityPassed | Broken | Repeat | StoppedEarly | Failed | Done,
    Field(discriminator="type_"),
]

_ADAPTER: TypeAdapter[TrialEvent] = TypeAdapter(TrialEvent)


def as_event(ev: TrialEvent | Mapping[str, Any]) -> TrialEvent:
    """The event, from itself or from its mapping (``{"type": "repeat", ...}``)."""
    if isinstance(ev, BaseModel):
        return ev
    return _ADAPTER.validate_python(dict(ev))
