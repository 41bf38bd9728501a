"""A check of the doctor's stage table: each step reads and writes only what it declares.

``Step.reads``/``Step.writes`` name context fields (``url``) and result fields (``res.facts``);
``res`` alone means the whole result. Declared but unchecked, the table drifts from what the
stages do (as the docs' stage order once drifted from the code). With ``CEILING_CHECK_STAGES=1``
(the tests set it) the flow runs every step under :func:`watched`:

- writes: every context and result field is fingerprinted before and after the step (its
  ``repr``, which shows a list appended to or a model changed in place, and its identity); a
  field that changed and is not declared as written is an error;
- reads: the context's attribute reads and the result's field reads (the result's class is
  swapped for a recording subclass during the step) must be declared as read or as written
  (``+=`` reads what it writes).

Not counted: the stage plumbing every step uses (``rec``, ``out``, the recorder's
``res.stages``), and the server's death, which any step that talks to the server may record
(``res.server_died``/``res.server_death``: the flow stops there).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from ceiling.diagnose.schema import DoctorResult

if TYPE_CHECKING:
    from ceiling.flows.doctor_context import DoctorContext, Step

#: the switch (the tests set it; off for users: the check costs a repr of the result per step)
ENV = "CEILING_CHECK_STAGES"
#: ``res`` as a context read is only the way to its fields, whose reads are noted one by one
PLUMBING = frozenset({"rec", "out", "res", "res.stages"})
DEATH = frozenset({"res.server_died", "res.server_death"})


class StageContractError(AssertionError):
    """A step read or wrote a field its declaration does not name (a bug of the table)."""


def checking() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def _ctx_names(ctx: DoctorContext) -> list[str]:
    return [f.name for f in fields(ctx) if not f.name.startswith("_")]


def _fingerprints(ctx: DoctorContext) -> dict[str, tuple[int, str]]:
    prints = {name: _print(object.__getattribute__(ctx, name)) for name in _ctx_names(ctx)}
    res = object.__getattribute__(ctx, "res")
    for name in type(res).model_fields:
        prints[f"res.{name}"] = _print(res.__dict__.get(name))
    return prints


def _print(value: Any) -> tuple[int, str]:
    return id(value), repr(value)


def _allowed(name: str, declared: set[str]) -> bool:
    return name in declared or (name.startswith("res.") and "res" in declared)


class _Recording(DoctorResult):
    """The result while a watched step runs: field reads are noted in ``_READS``."""

    def __getattribute__(self, name: str) -> Any:
        if name in DoctorResult.model_fields and _READS is not None:
            _READS.add(f"res.{name}")
        return super().__getattribute__(name)


_READS: set[str] | None = None


@contextlib.contextmanager
def watched(ctx: DoctorContext, step: Step) -> Iterator[None]:
    """Run one step under the check (see the module docstring); StageContractError names the
    step and the fields it read or wrote without declaring them."""
    global _READS
    before = _fingerprints(ctx)
    reads: set[str] = set()
    res = object.__getattribute__(ctx, "res")
    _READS = reads
    object.__setattr__(ctx, "_reads", reads)
    res.__class__ = _Recording
    try:
        yield
    finally:
        res.__class__ = DoctorResult
        object.__setattr__(ctx, "_reads", None)
        _READS = None
    after = _fingerprints(ctx)
    written = {k for k in after if after[k] != before.get(k)} - PLUMBING - DEATH
    written.discard("res")  # the result object itself is never replaced
    may_write = set(step.writes)
    may_read = set(step.reads) | may_write
    bad_writes = sorted(w for w in written if not _allowed(w, may_write))
    bad_reads = sorted(r for r in reads - PLUMBING - DEATH if not _allowed(r, may_read))
    problems = [f"writes {', '.join(bad_writes)}"] if bad_writes else []
    problems += [f"reads {', '.join(bad_reads)}"] if bad_reads else []
    if problems:
        raise StageContractError(
            f"doctor step {step.name!r} {' and '.join(problems)} without declaring it "
            "(Step.reads/Step.writes in ceiling.flows.doctor.STAGES)"
        )
