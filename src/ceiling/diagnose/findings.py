"""Findings: claims derived from EngineFacts, each with the log lines that prove it.

The rules follow ../shared/throughput-killers.md (IDs in ``ref``). A finding says what it costs
(``predicted_effect``, in words: the numbers are the catalogue's measured magnitudes, not a
prediction for this box) and whether it is ``fundamental`` (hardware) or ``configurable``.
Thresholds marked *heuristic* are our choice, derived from the catalogue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from ceiling.diagnose.logs import EngineFacts

# heuristic: a start-up longer than this makes every relaunch a cost worth weighing
SLOW_START_S = 300.0
# heuristic: weights loading above this share of start-up means restarts are load-bound
LOAD_SHARE = 0.5


class Finding(BaseModel):
    """One diagnosed issue, with its evidence and what to do about it."""

    id: str
    title: str
    severity: Literal["info", "warning", "critical"] = "warning"
    evidence: list[str] = Field(default_factory=list)
    fix: str | None = None
    kind: Literal["fundamental", "configurable"] = "configurable"
    predicted_effect: str | None = None
    ref: str | None = None


# Findings that follow from one kind of evidence line alone (the log parser's evidence key), in
# report order. ``fix`` is engine-neutral: an engine adapter's ``finding_fixes`` says it in
# that engine's flags.
_FROM_EVIDENCE: dict[str, dict[str, str]] = {
    "fp8_kv_unavailable": {
        "id": "fp8-kv-unavailable",
        "title": "FP8 KV cache unavailable with this backend/model",
        "severity": "warning",
        "fix": "pick an attention backend that supports FP8 KV, or accept the BF16 KV size",
        "kind": "configurable",
        "predicted_effect": "KV capacity and KV read bandwidth stay at 16-bit (2x FP8)",
        "ref": "E3",
    },
    "partial_cudagraphs": {
        "id": "partial-cudagraphs",
        "title": "CUDA graphs only partly used (PIECEWISE downgrade or truncated capture)",
        "severity": "warning",
        "fix": "use a full-graph attention backend; capture graphs up to the batch size",
        "kind": "configurable",
        "predicted_effect": "up to 4.3x at 30k context in one report (throughput-killers B2)",
        "ref": "B2",
    },
    "default_moe_config": {
        "id": "default-moe-config",
        "title": "MoE kernels run with the default (untuned) config",
        "severity": "info",
        "fix": "tune the fused-MoE config for this GPU/shape or pick another MoE backend",
        "kind": "configurable",
        "predicted_effect": "a few to tens of percent on MoE layers (throughput-killers E1)",
        "ref": "E1",
    },
    "unknown_env": {
        "id": "unknown-env",
        "title": "The engine ignored environment variables it does not know",
        "severity": "warning",
        "fix": "fix the names (run `ceiling preflight`): these settings were never applied",
        "kind": "configurable",
        "predicted_effect": "the run did not test what it meant to test (throughput-killers H2)",
        "ref": "H2",
    },
}

_Fix = Callable[[str, str], str]


def _without_fix(spec: dict[str, str]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k != "fix"}


def _fixer(engine: str | None) -> _Fix:
    """finding id, neutral advice -> the advice in the engine's own flags when it has them."""
    fixes: dict[str, str] = {}
    if engine:
        from ceiling.engines import get_engine
        from ceiling.errors import CeilingError

        try:
            fixes = get_engine(engine).finding_fixes
        except CeilingError:
            fixes = {}
    return lambda finding_id, neutral: fixes.get(finding_id, neutral)


def derive_findings(facts: EngineFacts, concurrency: int | None = None) -> list[Finding]:
    """All findings the facts support (``concurrency``: the load the user intends to serve)."""
    out: list[Finding] = []
    fix = _fixer(facts.engine)
    on_gpu = facts.device not in ("cpu",)
    ev = facts.evidence
    tp = facts.tensor_parallel_size or 1

    if facts.custom_allreduce_disabled and tp > 1 and on_gpu:
        reason = facts.custom_allreduce_reason or "disabled"
        pcie = "PCIe" in reason or "P2P" in reason
        out.append(
            Finding(
                id="custom-allreduce-off",
                title=f"Custom allreduce is off at TP={tp}: every decode allreduce goes through NCCL",
                severity="critical" if pcie and tp > 2 else "warning",
                evidence=ev.get("custom_allreduce", []),
                fix=(
                    "on <=4 same-NUMA GPUs with working P2P, use a PCIe one-shot allreduce "
                    "(restore P2P/ForceP2P first); otherwise keep NCCL and tune it for small "
                    "messages (LL protocol, channels)"
                ),
                kind="configurable",
                predicted_effect=(
                    "about 2 allreduces per layer per token are latency-bound: NCCL ~13-25 us vs "
                    "custom/one-shot 6-16 us at <=32 KB on PCIe (throughput-killers A12)"
                ),
                ref="A12",
            )
        )

    fusions_on = any(
        on
        for name, on in (facts.fusion_passes or {}).items()
        if name.startswith("fuse_") or name in ("enable_fusion", "enable_attn_fusion")
    )
    if facts.quantization == "compressed-tensors" and _is_int4(facts) and not fusions_on:
        out.append(
            Finding(
                id="int4-without-fusion",
                title="INT4 compressed-tensors path runs without fusion passes",
                severity="warning",
                evidence=ev.get("linear_kernel", []) + ev.get("compilation", []),
                fix=fix(
                    "int4-without-fusion",
                    "turn on the engine's norm/activation-quant fusion passes",
                ),
                kind="configurable",
                predicted_effect="unfused norm/activation/quant kernels add launches and memory "
                "round-trips every layer (throughput-killers B3)",
                ref="B3",
            )
        )

    eager = facts.enforce_eager or facts.cudagraph_mode in ("NONE", "0")
    if eager:
        out.append(
            Finding(
                id="eager-mode",
                title="CUDA graphs are off (eager mode / cudagraph_mode NONE)",
                severity="warning" if on_gpu else "info",
                evidence=ev.get("eager", []) + ev.get("compilation", [])[:1],
                # on CPU there are no CUDA graphs: a platform fact, nothing to change
                fix=fix("eager-mode", "turn CUDA graphs on (drop the engine's eager-mode flag)")
                if on_gpu
                else None,
                kind="configurable" if on_gpu else "fundamental",
                predicted_effect=(
                    "decode step 9.71 -> 4.75 ms with a CUDA graph for a Llama-8B shape on one "
                    "H200 (design.md probe); less for large models"
                    if on_gpu
                    else "none: CUDA graphs do not exist on CPU"
                ),
                ref="B1",
            )
        )

    if facts.max_concurrency is not None:
        want = concurrency
        if want is not None and facts.max_concurrency < want:
            out.append(_kv_finding(facts, want, fix))
        elif want is None and facts.max_concurrency < 1.0:
            out.append(_kv_finding(facts, 1, fix))

    for key, spec in _FROM_EVIDENCE.items():
        if ev.get(key):
            out.append(
                Finding(evidence=ev[key], fix=fix(spec["id"], spec["fix"]), **_without_fix(spec))
            )

    start = facts.startup_s
    load = facts.weights_load_s or facts.model_load_s
    if start and start >= SLOW_START_S:
        share = f"; loading weights {load:.0f} s of it" if load else ""
        out.append(
            Finding(
                id="slow-restart",
                title=f"Each restart costs {start / 60:.1f} min{share}",
                severity="info",
                evidence=ev.get("load", []) + ev.get("init", []),
                fix="preflight every variant first and batch changes per relaunch; keep the "
                "server up and vary only request-side settings where possible",
                kind="configurable" if not load or load / start < LOAD_SHARE else "fundamental",
                predicted_effect=f"{start / 60:.1f} min of GPU time lost per relaunch",
                ref="design.md founding story",
            )
        )
    return out


def _is_int4(facts: EngineFacts) -> bool:
    text = " ".join([facts.linear_kernel or "", facts.moe_kernel or "", facts.quant_scheme or ""])
    return any(k in text for k in ("WNA16", "W4A16", "Marlin", "int4", "INT4", "wNa16"))


def _kv_finding(facts: EngineFacts, want: int, fix: _Fix) -> Finding:
    return Finding(
        id="kv-capacity",
        title=(
            f"KV cache holds {facts.max_concurrency:.2f} full-length requests; {want} requested"
        ),
        severity="critical",
        evidence=facts.evidence.get("kv", []),
        fix=fix(
            "kv-capacity",
            "more KV: give the KV cache more memory, an FP8 KV cache, a shorter max length, "
            "or serve fewer sequences",
        ),
        kind="configurable",
        predicted_effect="requests beyond capacity are preempted and recomputed: throughput "
        "collapses (~14x in one report, throughput-killers C1)",
        ref="C1",
    )
