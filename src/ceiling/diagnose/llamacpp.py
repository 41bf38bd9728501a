"""Findings from the llama.cpp bandwidth verdict (``engines.llamacpp_gap`` measures; this words)."""

from __future__ import annotations

from ceiling.diagnose.finding_types import Finding
from ceiling.engines.llamacpp_gap import ServerCost


def server_cost_finding(cost: ServerCost) -> Finding:
    """The server's own cost per token, named (docs/causes/server-overhead.md)."""
    return Finding(
        id="server-overhead",
        title=f"llama-server adds {cost.added_ms:.2f} ms per token (+{cost.added_pct:.0f} %) over "
        "llama-bench on the same file and settings",
        component="engine",
        severity="info",
        evidence=[
            f"llama-server single-stream step {cost.server_step_ms:.3f} ms (measured here)",
            f"llama-bench tg at depth 0: {cost.bench_step_ms:.3f} ms per token ({cost.source})",
        ],
        fix="sampling over the whole vocabulary, HTTP/SSE and slot handling cost this per token; "
        "greedy or top-k-only sampling shrinks the sampler's share",
        kind="configurable",
        predicted_effect=f"{cost.added_ms:.3f} ms per token at most (the kernels alone)",
        figures={
            "added_ms": cost.added_ms,
            "added_pct": cost.added_pct,
            "server_step_ms": cost.server_step_ms,
            "bench_step_ms": cost.bench_step_ms,
        },
        doc="docs/causes/server-overhead.md",
    )
