"""Findings from what doctor measured: the engine's own ``/metrics`` beside the client's timing.

A start-up log says how a server is configured; a run says what that configuration did. Three
causes show only in a run, each named with the part of the deployment it blames and the
direction of its effect (all cost speed):

- ``kv-preemption``: the engine's preemption counter rose during the concurrency bench;
- ``concurrency-cap``: at a concurrency above one, requests spent a large share of their time in
  the engine's queue while total throughput did not grow (a running-sequence cap, or a KV cache
  that holds fewer sequences than were sent);
- ``frontend-bound``: several tokens arrived per streamed chunk where the engine streams one per
  step: the API server (HTTP, detokenization, streaming) fell behind the engine and shipped what
  had piled up.
Thresholds are heuristics, stated next to each.
"""

from __future__ import annotations

from typing import Any

from ceiling.diagnose.facts import EngineFacts
from ceiling.diagnose.finding_types import (
    COMPONENTS,
    Finding,
    FindingContext,
    Precondition,
    decide,
    doc_path,
)

# heuristic: tokens per streamed chunk above this (the engine streams one per step) = the API
# server merged steps that waited for it; on the busy 2-core test box healthy runs measured 1.0,
# an API server stopped 80 % of the time 1.9-6.0
CHUNK_TOKENS = 1.25
# heuristic: requests waiting this share of their time in the engine's queue = not admitted
QUEUE_SHARE = 0.3


def _levels(bench: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not bench:
        return []
    levels = bench.get("levels") or []
    return levels if levels else [bench]


def _q(level: dict[str, Any], name: str) -> dict[str, Any]:
    return (((level.get("server_metrics") or {}).get("quantities")) or {}).get(name) or {}


def _counter(level: dict[str, Any], name: str) -> dict[str, Any]:
    return (((level.get("server_metrics") or {}).get("counters")) or {}).get(name) or {}


def preemption(
    facts: EngineFacts, bench: dict[str, Any] | None, ctx: FindingContext
) -> Finding | None:
    """Any preemption during the concurrency bench (the counter's increase over the run)."""
    from ceiling.diagnose.rules_serving import kv_remedies

    hits = [
        (lv.get("concurrency"), _counter(lv, "preemptions"))
        for lv in _levels(bench)
        if (_counter(lv, "preemptions").get("delta") or 0) > 0
    ]
    if not hits:
        return None
    total = sum(int(c["delta"]) for _, c in hits)
    metric = hits[0][1].get("metric")
    f = Finding(
        id="kv-preemption",
        title=f"The KV cache ran out: {total} preemptions during the bench",
        component=COMPONENTS["kv-preemption"],
        severity="critical",
        evidence=[
            f"{int(c['delta'])} preemptions at concurrency {lvl} ({metric})" for lvl, c in hits
        ],
        predicted_effect="preempted requests drop their KV cache and are recomputed: the work "
        "is done twice and the batch shrinks",
        doc=doc_path("kv-capacity"),
    )
    f.fix, f.preconditions = kv_remedies(facts, ctx)
    return f


def queueing(
    facts: EngineFacts, bench: dict[str, Any] | None, ctx: FindingContext
) -> Finding | None:
    """Requests waited in the engine's queue at concurrency > 1 while throughput stayed flat."""
    from ceiling.diagnose.rules_serving import kv_remedies

    rows = [lv for lv in _levels(bench) if (lv.get("concurrency") or 1) > 1]
    if not rows:
        return None
    top = max(rows, key=lambda lv: lv.get("concurrency") or 0)
    queue, e2e = _q(top, "queue").get("server_mean_ms"), _q(top, "e2el").get("server_mean_ms")
    if not queue or not e2e or queue / e2e < QUEUE_SHARE:
        return None
    c = int(top["concurrency"])
    by = {int(lv.get("concurrency") or 1): lv for lv in _levels(bench) if not lv.get("failed")}
    gain = None
    if 1 in by and c in by and by[1].get("output_throughput"):
        gain = by[c]["output_throughput"] / by[1]["output_throughput"] - 1.0
    cap = facts.non_default_args.get(
        "max_num_seqs", facts.non_default_args.get("max_running_requests")
    )
    f = Finding(
        id="concurrency-cap",
        title=f"At {c} concurrent streams requests waited {100 * queue / e2e:.0f} % of their "
        "time in the engine's queue",
        component=COMPONENTS["concurrency-cap"],
        severity="critical",
        evidence=[
            f"mean queue time {queue:.4g} ms of a {e2e:.4g} ms request at concurrency {c} "
            f"({_q(top, 'queue').get('metric')})"
        ]
        + (
            [f"total output throughput {100 * gain:+.3g} % from 1 to {c} streams"]
            if gain is not None
            else []
        ),
        predicted_effect="the engine runs fewer sequences than are sent: total throughput stays "
        "where fewer streams put it, and every queued request waits",
        doc=doc_path("concurrency-cap"),
    )
    if isinstance(cap, int) and cap < c:
        from ceiling.diagnose.rules import _fix

        f.title += f" (running-sequence cap {cap})"
        f.evidence += facts.evidence.get("non_default", [])[:1]
        return decide(
            f,
            [
                Precondition(
                    fact="the running-sequence cap is below the concurrency",
                    holds=True,
                    because=f"cap {cap}, concurrency {c}",
                )
            ],
            _fix(ctx, "concurrency-cap", f"raise the running-sequence cap to at least {c}"),
        )
    if facts.max_concurrency is not None and facts.max_concurrency < c:
        f.fix, f.preconditions = kv_remedies(facts, ctx)
        f.component = COMPONENTS["kv-capacity"]
        return f
    return decide(
        f,
        [
            Precondition(
                fact="the cause is a running-sequence cap rather than the KV cache",
                holds=None,
                because="neither the cap nor the KV capacity is in the log",
            )
        ],
        None,
        "Pass the server's log (--log) so the cap and the KV capacity can be read.",
    )


def frontend(
    facts: EngineFacts, bench: dict[str, Any] | None, ctx: FindingContext
) -> Finding | None:
    """Several tokens per streamed chunk where the engine streams one per step: the API server
    fell behind and shipped what had piled up (vLLM merges queued engine outputs per request).

    The count is made by the server, not the client, so a slow client does not cause it.
    Needs: an engine that streams every token (vLLM with ``stream_interval`` 1, its default).
    Checked: vLLM 0.32 config/scheduler.py (``stream_interval`` default 1),
    v1/engine/output_processor.py (``RequestOutputCollector``: outputs that wait are merged).
    """
    if not bench or facts.engine != "vllm":
        return None
    tpc = bench.get("tokens_per_chunk")
    interval = facts.non_default_args.get("stream_interval", 1)
    if not tpc or tpc < CHUNK_TOKENS or interval != 1:
        return None
    itl = _q(bench, "itl")
    f = Finding(
        id="frontend-bound",
        title=f"The API server fell behind the engine: {tpc:.3g} tokens per streamed chunk "
        "where the engine makes one per step",
        component=COMPONENTS["frontend-bound"],
        severity="warning",
        evidence=[f"mean {tpc:.3g} tokens per chunk in the single-stream bench (stream interval 1)"]
        + (
            [
                f"the engine's own inter-token latency {itl['server_mean_ms']:.3g} ms "
                f"({itl.get('metric')}); time to first token client "
                f"{_q(bench, 'ttft').get('client_mean_ms') or 0:.4g} ms vs engine "
                f"{_q(bench, 'ttft').get('server_mean_ms') or 0:.4g} ms"
            ]
            if itl.get("server_mean_ms")
            else []
        ),
        predicted_effect="tokens reach clients late and in bursts: time to first token and "
        "streaming smoothness suffer although the engine is as fast as before",
        doc=doc_path("frontend-bound"),
    )
    from ceiling.diagnose.rules import _fix

    f.fix = _fix(
        ctx,
        "frontend-bound",
        "give the API server CPU time (other load off its cores); if it is busy with its own "
        "work, run more API server processes",
    )
    return f


def runtime_findings(
    facts: EngineFacts, bench: dict[str, Any], ctx: FindingContext
) -> list[Finding]:
    """The measured findings of one doctor run (``bench``: doctor's bench results by mode)."""
    found = [
        preemption(facts, bench.get("concurrency"), ctx),
        queueing(facts, bench.get("concurrency"), ctx),
        frontend(facts, bench.get("single"), ctx),
    ]
    return [f for f in found if f is not None]
