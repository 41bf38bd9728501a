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

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from ceiling.diagnose.logs import EngineFacts

DOCS = "docs/causes"


class Precondition(BaseModel):
    """A fact the finding's advice needs: holds (True), ruled out (False) or unknown (None)."""

    fact: str
    holds: bool | None
    because: str


# the part of the deployment each finding blames (what a user would change or look at)
COMPONENTS = {
    "custom-allreduce-off": "tensor-parallel allreduce",
    "compile-off": "torch.compile",
    "quant-fusion-off": "fusion passes (norm/activation + quant)",
    "allreduce-fusion-off": "fusion passes (allreduce + RMSNorm)",
    "eager-mode": "CUDA graphs / torch.compile (eager mode)",
    "partial-cudagraphs": "CUDA graphs",
    "kv-capacity": "KV cache",
    "kv-preemption": "KV cache",
    "concurrency-cap": "scheduler (running-sequence cap)",
    "frontend-bound": "API server / detokenizer / client",
    "weight-only-fallback": "linear kernels (quantization format)",
    "quant-emulation": "linear kernels (quantization format)",
    "fp8-kv-unavailable": "KV cache (dtype)",
    "default-moe-config": "MoE kernels",
    "expert-parallel-pcie": "parallel layout (expert parallelism)",
    "spec-decode-acceptance": "speculative decoding",
    "unknown-env": "configuration (environment)",
    "slow-restart": "start-up",
}


class Finding(BaseModel):
    """One diagnosed issue, with its evidence, its preconditions and what to do about it.

    ``component`` names the part of the deployment it blames; ``direction`` what it does to
    throughput ("slower": every finding here costs speed).
    """

    id: str
    title: str
    component: str | None = None
    direction: Literal["slower", "faster"] = "slower"
    severity: Literal["info", "warning", "critical"] = "warning"
    evidence: list[str] = Field(default_factory=list)
    fix: str | None = None
    kind: Literal["fundamental", "configurable"] = "configurable"
    predicted_effect: str | None = None
    doc: str | None = Field(None, description="the cause's page: docs/causes/<cause>.md")
    preconditions: list[Precondition] = Field(default_factory=list)
    withheld: str | None = Field(
        None, description="why no advice is given: the preconditions that are unknown"
    )


class FindingContext(BaseModel):
    """Facts a start-up log does not hold, from whoever knows them (doctor, inspect's flags)."""

    concurrency: int | None = Field(None, description="concurrent streams the user intends")
    compute_capability: str | None = Field(None, description="'9.0' Hopper, '10.0' B200 ...")
    gpu: str | None = Field(None, description="catalog GPU name the capability came from")
    interconnect: Literal["nvlink", "pcie"] | None = None
    p2p: bool | None = Field(None, description="peer-to-peer works between every GPU pair")
    request_tokens: int | None = Field(None, description="prompt + output tokens of a request")


def doc_path(cause: str) -> str:
    return f"{DOCS}/{cause}.md"


def decide(
    finding: Finding, preconditions: list[Precondition], fix: str | None, how_to_know: str = ""
) -> Finding | None:
    """Attach the preconditions; advise only when all hold.

    None (no finding) when one is ruled out: the advice could not work. With unknowns the
    finding stays, without ``fix``, and says what is missing (``how_to_know``: how to find out).
    """
    finding.preconditions = preconditions
    if any(p.holds is False for p in preconditions):
        return None
    unknown = [p for p in preconditions if p.holds is None]
    if unknown:
        finding.fix = None
        finding.withheld = (
            "no advice: unknown whether "
            + "; ".join(f"{p.fact} ({p.because})" for p in unknown)
            + (f". {how_to_know}" if how_to_know else "")
        )
    else:
        finding.fix = fix
    return finding


def context_for(hardware: dict[str, object] | None, **kw: object) -> FindingContext:
    """A context from doctor's hardware description (a catalog GPU, the probed link and P2P)
    plus explicit values."""
    ctx = FindingContext(**{k: v for k, v in kw.items() if v is not None})
    hw = hardware or {}
    name = str(hw.get("name") or "") if hw.get("kind") == "gpu" else ""
    link = str(hw.get("link") or "")
    if link and ctx.interconnect is None:
        ctx.interconnect = "nvlink" if link.startswith("nvlink") else "pcie"
    if isinstance(hw.get("p2p"), bool) and ctx.p2p is None:
        ctx.p2p = bool(hw["p2p"])
    if name:
        from ceiling.errors import CeilingError
        from ceiling.spec.hardware import load_gpu

        try:
            gpu = load_gpu(name)
        except CeilingError:
            return ctx
        ctx.gpu = gpu.name
        if gpu.sm and not ctx.compute_capability:  # the catalog's compute capability x10
            ctx.compute_capability = f"{gpu.sm // 10}.{gpu.sm % 10}"
        if ctx.interconnect is None:
            ctx.interconnect = "nvlink" if gpu.nvlink else "pcie"
    return ctx


def derive_findings(
    facts: EngineFacts, concurrency: int | None = None, context: FindingContext | None = None
) -> list[Finding]:
    """All findings the facts support (``concurrency``: the load the user intends to serve)."""
    from ceiling.diagnose.rules_compile import RULES_COMPUTE
    from ceiling.diagnose.rules_serving import RULES_SERVING

    ctx = context.model_copy() if context else FindingContext()
    if concurrency is not None:
        ctx.concurrency = concurrency
    out: list[Finding] = []
    for rule in (*RULES_COMPUTE, *RULES_SERVING):
        found = rule(facts, ctx)
        if found is not None:
            found.component = found.component or COMPONENTS.get(found.id)
            out.append(found)
    return out
