"""Findings: claims derived from EngineFacts, each with the log lines that prove it.

A finding says what it costs (``predicted_effect``, in words: the numbers are measured
magnitudes from published reports, not a prediction for this box), whether the cause is
``fundamental`` (hardware) or ``configurable``, and links the page that explains the cause
(``doc``: ``docs/causes/<cause>.md``).

Every rule (``rules.py``) states the facts its *advice* needs. A finding carries them as
``preconditions``: each holds (True), is ruled out (False) or is unknown (None), with the fact
it was decided from. Advice (``fix``) is given only when every precondition holds. A finding
whose advice would rest on a false precondition is not made at all (the fix could not work);
one whose preconditions are unknown says which facts are missing and how to get them
(``withheld``) instead of advising.
"""

from __future__ import annotations

from collections.abc import Mapping

from ceiling.diagnose.facts import EngineFacts
from ceiling.diagnose.finding_types import (
    COMPONENTS,
    DOCS,
    Finding,
    FindingContext,
    Precondition,
    decide,
    doc_path,
)
from ceiling.diagnose.rules_compile import RULES_COMPUTE
from ceiling.diagnose.rules_serving import RULES_SERVING
from ceiling.errors import CeilingError
from ceiling.spec.hardware import GpuHardware, Hardware

__all__ = [
    "COMPONENTS",
    "DOCS",
    "Finding",
    "FindingContext",
    "Precondition",
    "context_for",
    "decide",
    "derive_findings",
    "doc_path",
]


def context_for(hardware: Hardware | None, **kw: object) -> FindingContext:
    """A context from the hardware (a catalog GPU, the probed link and P2P) plus explicit
    values."""
    ctx = FindingContext(**{k: v for k, v in kw.items() if v is not None})
    if not isinstance(hardware, GpuHardware):
        return ctx
    if hardware.link and ctx.interconnect is None:
        ctx.interconnect = "nvlink" if hardware.link.startswith("nvlink") else "pcie"
    if hardware.p2p is not None and ctx.p2p is None:
        ctx.p2p = hardware.p2p
    try:
        gpu = hardware.gpu()
    except CeilingError:
        return ctx
    ctx.gpu = gpu.name
    if gpu.sm and not ctx.compute_capability:  # the catalog's compute capability x10
        ctx.compute_capability = f"{gpu.sm // 10}.{gpu.sm % 10}"
    if ctx.interconnect is None:
        ctx.interconnect = "nvlink" if gpu.nvlink else "pcie"
    return ctx


def derive_findings(
    facts: EngineFacts,
    concurrency: int | None = None,
    context: FindingContext | None = None,
    fixes: Mapping[str, str] | None = None,
) -> list[Finding]:
    """All findings the facts support (``concurrency``: the load the user intends to serve;
    ``fixes``: the engine adapter's ``finding_fixes``, else engine-neutral advice)."""
    ctx = context.model_copy() if context else FindingContext()
    if concurrency is not None:
        ctx.concurrency = concurrency
    if fixes is not None:
        ctx.fixes = dict(fixes)
    out: list[Finding] = []
    for rule in (*RULES_COMPUTE, *RULES_SERVING):
        found = rule(facts, ctx)
        if found is not None:
            found.component = found.component or COMPONENTS.get(found.id)
            out.append(found)
    return out
