"""The nouns of the findings: Finding, its Precondition, the FindingContext rules read.

Kept apart from the rules and from the log grammar so that every module can name them without
importing either (see ``findings.py`` for what a finding promises).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ceiling.engines.facts import StreamingTraits

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
    "queueing": "scheduler (running-sequence cap)",
    "narrow-batches": "scheduler (running-sequence cap)",
    "frontend-bound": "API server / detokenizer / client",
    "weight-only-fallback": "linear kernels (quantization format)",
    "quant-emulation": "linear kernels (quantization format)",
    "fp8-kv-unavailable": "KV cache (dtype)",
    "default-moe-config": "MoE kernels",
    "expert-parallel-pcie": "parallel layout (expert parallelism)",
    "spec-decode-acceptance": "speculative decoding",
    "unknown-env": "configuration (environment)",
    "slow-restart": "start-up",
    "startup-warmup": "start-up",
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
    figures: dict[str, float] = Field(
        default_factory=dict,
        description="the numbers the finding states, by name (its title and evidence word them)",
    )
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
    # the engine adapter's fixes in its own flags (finding id or id.option -> text), given by
    # whoever knows the engine (the log reader, doctor): rules never import the adapters
    fixes: dict[str, str] = Field(default_factory=dict)
    # how the engine streams (its adapter's ``streaming``), for the frontend-bound check
    streaming: StreamingTraits | None = None


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
