"""Findings from what doctor measured: the engine's own ``/metrics`` beside the client's timing.

A start-up log says how a server is configured; a run says what that configuration did. Four
causes show only in a run, each named with the part of the deployment it blames and the
direction of its effect (all cost speed):

- ``kv-preemption``: the engine's preemption counter rose during the concurrency bench;
- ``queueing``: at a concurrency above one, requests spent a large share of their time in
  the engine's queue while total throughput did not grow (a running-sequence cap, or a KV cache
  that holds fewer sequences than were sent);
- ``narrow-batches``: at a concurrency of several streams the engine generated about one token
  per step (its generated-token counter over its step count): it ran one sequence at a time,
  whatever the client's timings say;
- ``frontend-bound``: clients waited clearly longer than the engine worked on their requests,
  or several tokens arrived per streamed chunk where the engine streams one per step: the API
  server (HTTP, detokenization, streaming) fell behind the engine.
Thresholds are heuristics, stated next to each.
"""

from __future__ import annotations

from pathlib import Path
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
# server merged steps that waited for it (more than one chunk in ten carried two steps); on the
# busy 2-core test box healthy runs measured 1.00-1.01, an API server stopped most of the time
# 1.16-6.0
CHUNK_TOKENS = 1.1
# heuristic: the client waiting this share of a request beyond the engine's own time for it
# (healthy runs on the test box 2-7 %; API server stopped 300 ms of every 320 ms 22-41 %)
DELIVERY_SHARE = 0.15
# heuristic: requests waiting this share of their time in the engine's queue = not admitted
QUEUE_SHARE = 0.3
# heuristic: at least this many streams sent, and fewer than this many sequences per engine step
# run, = the batching is gone (a cap of one runs exactly 1.00; the unchanged tiny server on the
# busy 2-core test box ran 3-8 at 8 streams)
BATCH_STREAMS = 4
NARROW_BATCH = 1.5


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
        id="queueing",
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


def batch_width(level: dict[str, Any]) -> float | None:
    """Sequences the engine ran per step during ``level``: tokens it generated / steps it ran
    (both its own counters), or None without them (another engine, no /metrics)."""
    steps = _counter(level, "engine_steps").get("delta")
    tokens = _counter(level, "generated_tokens").get("delta")
    if not steps or tokens is None or steps <= 0:
        return None
    return float(tokens) / float(steps)


def narrow_batches(
    facts: EngineFacts, bench: dict[str, Any] | None, ctx: FindingContext
) -> Finding | None:
    """Many streams sent, about one sequence per engine step run: the batching gain is gone.

    Read from the engine's counters, not from throughput: on a shared machine the client's
    throughput ratios swing by 2-4x between runs, the scheduler's batch does not. Blames the
    running-sequence cap when the log shows one below the load, the KV cache when it holds
    fewer sequences than were sent and preempted (or holds under two), otherwise the API server
    (it passed the requests on one at a time).
    """
    rows = [
        (int(lv["concurrency"]), w)
        for lv in _levels(bench)
        if (lv.get("concurrency") or 1) >= BATCH_STREAMS and not lv.get("failed")
        if (w := batch_width(lv)) is not None
    ]
    if not rows:
        return None
    c, width = max(rows)
    if width >= NARROW_BATCH:
        return None
    from ceiling.diagnose.rules import _fix
    from ceiling.diagnose.rules_serving import kv_remedies

    f = Finding(
        id="narrow-batches",
        title=f"At {c} concurrent streams the engine ran {width:.2f} sequences per step",
        component=COMPONENTS["frontend-bound"],
        severity="critical",
        evidence=[
            f"{width:.3f} generated tokens per engine step at concurrency {c} "
            "(vllm:generation_tokens_total / vllm:iteration_tokens_total count)"
        ],
        predicted_effect="each step serves about one stream: total throughput stays at one "
        "stream's and every other stream waits",
        doc=doc_path("concurrency-cap"),
    )
    cap = facts.non_default_args.get(
        "max_num_seqs", facts.non_default_args.get("max_running_requests")
    )
    if isinstance(cap, int) and cap < c:
        f.component = COMPONENTS["concurrency-cap"]
        f.title += f" (running-sequence cap {cap})"
        f.fix = _fix(ctx, "concurrency-cap", f"raise the running-sequence cap to at least {c}")
        return f
    kv = facts.max_concurrency
    preempted = any((_counter(lv, "preemptions").get("delta") or 0) > 0 for lv in _levels(bench))
    if kv is not None and kv < c and (preempted or kv < 2):
        # the cache holds fewer sequences than were sent, and it bit: preemptions, or room for
        # under two full-length requests
        f.component = COMPONENTS["kv-capacity"]
        f.fix, f.preconditions = kv_remedies(facts, ctx)
        return f
    f.component = COMPONENTS["frontend-bound"]
    known = facts.max_concurrency is not None
    return decide(
        f,
        [
            Precondition(
                fact="neither a running-sequence cap nor the KV cache holds the batch to one",
                holds=True if known else None,
                because=f"no cap below {c} in the log; KV cache for "
                f"{facts.max_concurrency:.3g} sequences"
                if known
                else "the start-up log was not read",
            )
        ],
        _fix(
            ctx,
            "frontend-bound",
            "give the API server CPU time: the engine had room to batch, so the requests "
            "reached it one at a time",
        ),
        "Pass the server's log (--log) so the cap and the KV capacity can be read.",
    )


def _delivery_share(bench: dict[str, Any]) -> tuple[float, float] | None:
    """(ms, share of the client's request time) the client waited beyond what the engine spent
    on the request (queue + prefill + decode, timestamped in the engine core)."""
    client = _q(bench, "e2el").get("client_mean_ms")
    engine = [_q(bench, k).get("server_mean_ms") for k in ("queue", "prefill", "decode")]
    if not client or any(v is None for v in engine):
        return None
    extra = client - sum(v for v in engine if v is not None)
    return extra, extra / client


def frontend(
    facts: EngineFacts, bench: dict[str, Any] | None, ctx: FindingContext
) -> Finding | None:
    """The API server fell behind the engine: the client waited clearly longer than the engine
    worked on its requests, or several tokens came per streamed chunk where the engine streams
    one per step (vLLM merges outputs that waited for the API server).

    Both numbers come from the server (its own histograms, its chunking), so a slow client does
    not make them. Needs: an engine whose queue/prefill/decode times are engine-side and that
    streams every token (vLLM with ``stream_interval`` 1, its default).
    Checked: vLLM 0.32 v1/metrics/stats.py (prefill, decode and queue times from engine-core
    timestamps), config/scheduler.py (``stream_interval`` default 1), v1/engine/
    output_processor.py (``RequestOutputCollector``: outputs that wait are merged).
    """
    if not bench or facts.engine != "vllm":
        return None
    if facts.non_default_args.get("stream_interval", 1) != 1:
        return None
    tpc = bench.get("tokens_per_chunk") or 0.0
    late = _delivery_share(bench)
    merged = tpc > CHUNK_TOKENS
    waited = late is not None and late[1] >= DELIVERY_SHARE
    if not merged and not waited:
        return None
    title = (
        f"The API server fell behind the engine: clients waited {late[0]:.4g} ms "
        f"({100 * late[1]:.0f} % of a request) beyond the engine's own time"
        if waited and late is not None
        else f"The API server fell behind the engine: {tpc:.3g} tokens per streamed chunk"
    )
    evidence = [f"mean {tpc:.3g} tokens per streamed chunk in the single-stream bench"]
    client = _q(bench, "e2el").get("client_mean_ms")
    if late is not None and client:
        evidence.append(
            f"client request time {client:.4g} ms; the engine spent {client - late[0]:.4g} ms "
            "on it (queue + prefill + decode, engine-core timestamps)"
        )
    f = Finding(
        id="frontend-bound",
        title=title,
        component=COMPONENTS["frontend-bound"],
        severity="warning",
        evidence=evidence,
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
        narrow_batches(facts, bench.get("concurrency"), ctx),
        frontend(facts, bench.get("single"), ctx),
    ]
    return [f for f in found if f is not None]


def inspect_run(
    res: Any, log_path: str | Path, engine: str | None, concurrency: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """doctor's inspection of ``res`` (a DoctorResult): the start-up log's findings checked
    against the probed hardware, the intended concurrency and request length, plus the findings
    of what the run measured. Returns (findings, facts) as JSON-ready dicts."""
    from ceiling.diagnose.findings import context_for
    from ceiling.diagnose.logs import inspect_log
    from ceiling.engines import get_engine

    tokens = (res.config.get("input_len") or 0) + (res.config.get("max_tokens") or 0)
    ctx = context_for(res.hardware, concurrency=concurrency, request_tokens=tokens or None)
    facts = inspect_log(log_path, engine=engine, concurrency=concurrency, context=ctx)
    if res.bench:
        ctx.fixes = dict(get_engine(facts.engine).finding_fixes) if facts.engine else {}
        facts.findings += runtime_findings(facts, res.bench, ctx)
    data = facts.model_dump(mode="json")
    return list(data.pop("findings", []) or []), data
