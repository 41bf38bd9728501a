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

from collections.abc import Mapping
from pathlib import Path

from ceiling.bench.metrics import BURST_ITL_MS
from ceiling.bench.results import LevelResult, RunResult
from ceiling.diagnose.facts import EngineFacts
from ceiling.diagnose.finding_types import (
    COMPONENTS,
    Finding,
    FindingContext,
    Precondition,
    decide,
    doc_path,
)
from ceiling.diagnose.findings import context_for
from ceiling.diagnose.logs import inspect_log
from ceiling.diagnose.measured import ServerView
from ceiling.diagnose.rules import engine_fix
from ceiling.diagnose.rules_serving import kv_remedies
from ceiling.diagnose.schema import BenchMode
from ceiling.engines.diagnosis_data import reading
from ceiling.gap_schema import ServerCost
from ceiling.spec.hardware import Hardware

# heuristic: tokens per streamed chunk above this (the engine streams one per step) = the API
# server merged steps that waited for it (more than one chunk in ten carried two steps); on the
# busy 2-core test box healthy runs measured 1.00-1.01, an API server stopped most of the time
# 1.16-6.0
CHUNK_TOKENS = 1.1
# heuristic: the client waiting this share of a request beyond the engine's own time for it
# (healthy runs on the test box 2-7 %; API server stopped 300 ms of every 320 ms 22-41 %)
DELIVERY_SHARE = 0.15
# heuristic: this share of the client's chunks arriving together (under BURST_ITL_MS apart by the
# kernel's receive timestamps, so not a slow client) while the engine produced the tokens apart
# = the API server delivered them in bursts (healthy single streams on the test box 0-34 %; an
# API server stopped 90 of every 100 ms 99.7 %, with one token per chunk: vLLM does not always
# merge the backlog)
BURST_SHARE = 0.8
# the engine's own mean inter-token time must be at least this (ms) for bursts to be the API
# server's: tokens the engine produced together arrive together by nature
ENGINE_ITL_MS = 0.5
# heuristic: requests waiting this share of their time in the engine's queue = not admitted
QUEUE_SHARE = 0.3
# heuristic: at least this many streams sent, and fewer than this many sequences per engine step
# run, = the batching is gone (a cap of one runs exactly 1.00; the unchanged tiny server on the
# busy 2-core test box ran 3-8 at 8 streams)
BATCH_STREAMS = 4
NARROW_BATCH = 1.5


def _levels(bench: RunResult | None) -> list[LevelResult]:
    if bench is None:
        return []
    return list(bench.levels) if bench.levels else [bench]


def preemption(facts: EngineFacts, bench: RunResult | None, ctx: FindingContext) -> Finding | None:
    """Any preemption during the concurrency bench (the counter's increase over the run)."""
    hits = [
        (lv.concurrency, ServerView.of(lv).counter("preemptions"))
        for lv in _levels(bench)
        if ServerView.of(lv).counter("preemptions").delta > 0
    ]
    if not hits:
        return None
    total = sum(int(c.delta) for _, c in hits)
    metric = hits[0][1].metric
    f = Finding(
        id="kv-preemption",
        title=f"The KV cache ran out: {total} preemptions during the bench",
        component=COMPONENTS["kv-preemption"],
        severity="critical",
        figures={"preemptions": total},
        evidence=[f"{int(c.delta)} preemptions at concurrency {lvl} ({metric})" for lvl, c in hits],
        predicted_effect="preempted requests drop their KV cache and are recomputed: the work "
        "is done twice and the batch shrinks",
        doc=doc_path("kv-capacity"),
    )
    f.fix, f.preconditions = kv_remedies(facts, ctx)
    return f


def queueing(facts: EngineFacts, bench: RunResult | None, ctx: FindingContext) -> Finding | None:
    """Requests waited in the engine's queue at concurrency > 1 while throughput stayed flat."""
    rows = [lv for lv in _levels(bench) if (lv.concurrency or 1) > 1]
    if not rows:
        return None
    top = max(rows, key=lambda lv: lv.concurrency or 0)
    view = ServerView.of(top)
    queue, e2e = view.quantity("queue").server_mean_ms, view.quantity("e2el").server_mean_ms
    if not queue or not e2e or queue / e2e < QUEUE_SHARE:
        return None
    c = int(top.concurrency or 1)
    by = {lv.concurrency or 1: lv for lv in _levels(bench) if not lv.failed}
    gain = None
    low, high = by.get(1), by.get(c)
    if low is not None and high is not None and low.output_throughput and high.output_throughput:
        gain = high.output_throughput / low.output_throughput - 1.0
    cap = facts.running_cap()
    f = Finding(
        id="queueing",
        title=f"At {c} concurrent streams requests waited {100 * queue / e2e:.0f} % of their "
        "time in the engine's queue",
        component=COMPONENTS["concurrency-cap"],
        severity="critical",
        figures={"concurrency": c, "queue_ms": queue, "request_ms": e2e}
        | ({"throughput_gain_pct": 100 * gain} if gain is not None else {}),
        evidence=[
            f"mean queue time {queue:.4g} ms of a {e2e:.4g} ms request at concurrency {c} "
            f"({view.quantity('queue').metric})"
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
        f.figures["cap"] = cap
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
            engine_fix(ctx, "concurrency-cap", f"raise the running-sequence cap to at least {c}"),
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


def batch_width(level: LevelResult | None) -> float | None:
    """Sequences the engine ran per step during ``level``: tokens it generated / steps it ran
    (both its own counters), or None without them (another engine, no /metrics)."""
    view = ServerView.of(level)
    steps = view.counters.get("engine_steps")
    tokens = view.counters.get("generated_tokens")
    if steps is None or tokens is None or steps.delta <= 0:
        return None
    return tokens.delta / steps.delta


def narrow_batches(
    facts: EngineFacts, bench: RunResult | None, ctx: FindingContext
) -> Finding | None:
    """Many streams sent, about one sequence per engine step run: the batching gain is gone.

    Read from the engine's counters, not from throughput: on a shared machine the client's
    throughput ratios swing by 2-4x between runs, the scheduler's batch does not. Blames the
    running-sequence cap when the log shows one below the load, the KV cache when it holds
    fewer sequences than were sent and preempted (or holds under two), otherwise the API server
    (it passed the requests on one at a time).
    """
    # levels with failed requests count too: a cap that queues streams until the client gives
    # up on them is this finding at its worst (the engine's counters still say what it ran)
    rows = [
        (int(lv.concurrency or 1), w, lv)
        for lv in _levels(bench)
        if (lv.concurrency or 1) >= BATCH_STREAMS and lv.completed
        if (w := batch_width(lv)) is not None
    ]
    if not rows:
        return None
    c, width, top = max(rows, key=lambda r: (not r[2].failed, r[0], r[1]))
    counters = ServerView.of(top).counters  # the engine's own metric names, as scraped
    if width >= NARROW_BATCH:
        return None
    f = Finding(
        id="narrow-batches",
        title=f"At {c} concurrent streams the engine ran {width:.2f} sequences per step",
        component=COMPONENTS["frontend-bound"],
        severity="critical",
        figures={"concurrency": c, "sequences_per_step": width},
        evidence=[
            f"{width:.3f} generated tokens per engine step at concurrency {c} "
            f"({counters['generated_tokens'].metric} / {counters['engine_steps'].metric})"
        ],
        predicted_effect="each step serves about one stream: total throughput stays at one "
        "stream's and every other stream waits",
        doc=doc_path("concurrency-cap"),
    )
    if top.failed:
        f.evidence.append(
            f"{top.failed} of {top.failed + top.completed} requests failed at concurrency {c}"
        )
    cap = facts.running_cap()
    if isinstance(cap, int) and cap < c:
        f.component = COMPONENTS["concurrency-cap"]
        f.figures["cap"] = cap
        f.title += f" (running-sequence cap {cap})"
        f.fix = engine_fix(
            ctx, "concurrency-cap", f"raise the running-sequence cap to at least {c}"
        )
        return f
    kv = facts.max_concurrency
    preempted = any(ServerView.of(lv).counter("preemptions").delta > 0 for lv in _levels(bench))
    if kv is not None and kv < c and (preempted or kv < 2):
        # the cache holds fewer sequences than were sent, and it bit: preemptions, or room for
        # under two full-length requests
        f.component = COMPONENTS["kv-capacity"]
        f.fix, f.preconditions = kv_remedies(facts, ctx)
        return f
    if top.failed:
        # streams that failed never reached the engine together: a narrow batch then says
        # nothing about the API server
        return None
    f.component = COMPONENTS["frontend-bound"]
    return decide(
        f,
        [
            Precondition(
                fact="neither a running-sequence cap nor the KV cache holds the batch to one",
                holds=True if kv is not None else None,
                because=f"no cap below {c} in the log; KV cache for {kv:.3g} sequences"
                if kv is not None
                else "the start-up log was not read",
            )
        ],
        engine_fix(
            ctx,
            "frontend-bound",
            "give the API server CPU time: the engine had room to batch, so the requests "
            "reached it one at a time",
        ),
        "Pass the server's log (--log) so the cap and the KV capacity can be read.",
    )


def _delivery_share(bench: RunResult) -> tuple[float, float] | None:
    """(ms, share of the client's request time) the client waited beyond what the engine spent
    on the request (queue + prefill + decode, timestamped in the engine core)."""
    view = ServerView.of(bench)
    client = view.quantity("e2el").client_mean_ms
    engine = [view.quantity(k).server_mean_ms for k in ("queue", "prefill", "decode")]
    if not client or any(v is None for v in engine):
        return None
    extra = client - sum(v for v in engine if v is not None)
    return extra, extra / client


def _bursts(bench: RunResult) -> tuple[float, float] | None:
    """(share of chunks that arrived together, the engine's mean inter-token ms) when the
    client's chunk times are the kernel's and the engine's own inter-token times were scraped;
    None otherwise (user-space times: a slow client makes bursts of its own)."""
    share = (bench.model_extra or {}).get("burst_chunk_share")
    if share is None or bench.timestamp_source != "kernel":
        return None
    itl = ServerView.of(bench).quantity("itl").server_mean_ms
    if not itl or itl < ENGINE_ITL_MS:
        return None
    return float(share), float(itl)


def frontend(facts: EngineFacts, bench: RunResult | None, ctx: FindingContext) -> Finding | None:
    """The API server fell behind the engine: the client waited clearly longer than the engine
    worked on its requests, or several tokens came per streamed chunk where the engine streams
    one per step (an engine that merges outputs that waited for the API server), or the chunks
    reached the client in bursts (kernel receive times) while the engine produced them apart.

    Both numbers come from the server (its own histograms, its chunking), so a slow client does
    not make them. What each needs of the engine is its adapter's ``streaming`` (in ``ctx``):
    engine-side request times for the first, merged waiting outputs and one token per step
    (its stream-interval argument at 1, the default) for the second. Without those traits
    (an engine whose adapter does not state them) the check says nothing.
    """
    traits = ctx.streaming
    if bench is None or traits is None:
        return None
    if traits.interval_arg and facts.non_default_args.get(traits.interval_arg, 1) != 1:
        return None
    tpc = float((bench.model_extra or {}).get("tokens_per_chunk") or 0.0)
    late = _delivery_share(bench)
    burst = _bursts(bench) if traits.engine_side_times else None
    merged = traits.merges_waiting_outputs and tpc > CHUNK_TOKENS
    waited = traits.engine_side_times and late is not None and late[1] >= DELIVERY_SHARE
    bursty = burst is not None and burst[0] >= BURST_SHARE
    if not merged and not waited and not bursty:
        return None
    if waited and late is not None:
        title = (
            f"The API server fell behind the engine: clients waited {late[0]:.4g} ms "
            f"({100 * late[1]:.0f} % of a request) beyond the engine's own time"
        )
    elif merged:
        title = f"The API server fell behind the engine: {tpc:.3g} tokens per streamed chunk"
    else:
        assert burst is not None  # bursty
        title = (
            f"The API server fell behind the engine: {100 * burst[0]:.0f} % of streamed chunks "
            "reached the client in bursts"
        )
    evidence = [f"mean {tpc:.3g} tokens per streamed chunk in the single-stream bench"]
    if burst is not None:
        evidence.append(
            f"{100 * burst[0]:.0f} % of chunks arrived within {BURST_ITL_MS:g} ms of the previous "
            f"one (the kernel's receive timestamps); the engine produced a token every "
            f"{burst[1]:.3g} ms"
        )
    client = ServerView.of(bench).quantity("e2el").client_mean_ms
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
        figures={"tokens_per_chunk": tpc}
        | ({"late_ms": late[0], "late_share_pct": 100 * late[1]} if late is not None else {})
        | ({"burst_chunk_share_pct": 100 * burst[0]} if burst is not None else {}),
    )
    f.fix = engine_fix(
        ctx,
        "frontend-bound",
        "give the API server CPU time (other load off its cores); if it is busy with its own "
        "work, run more API server processes",
    )
    return f


def runtime_findings(
    facts: EngineFacts, bench: Mapping[BenchMode, RunResult], ctx: FindingContext
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
    log_path: str | Path,
    engine: str | None,
    hardware: Hardware | None,
    bench: Mapping[BenchMode, RunResult],
    concurrency: int,
    request_tokens: int | None,
    env: Mapping[str, str] | None = None,
) -> tuple[EngineFacts, list[Finding]]:
    """doctor's inspection: the start-up log's facts and findings, checked against the
    hardware, the intended concurrency and request length, plus the findings of what the run
    measured (``bench``: doctor's bench results by mode)."""
    ctx = context_for(hardware, concurrency=concurrency, request_tokens=request_tokens)
    facts = inspect_log(log_path, engine=engine, concurrency=concurrency, context=ctx, env=env)
    findings = list(facts.findings)
    if bench:
        known = reading(facts.engine) if facts.engine else None
        ctx.fixes = dict(known.finding_fixes) if known else {}
        ctx.streaming = known.streaming if known else None
        findings += runtime_findings(facts, bench, ctx)
    return facts, findings


def server_cost_finding(cost: ServerCost) -> Finding:
    """The server's own cost per token over the engine's kernel benchmark, named
    (docs/causes/server-overhead.md; the engine's step split measured it)."""
    return Finding(
        id="server-overhead",
        title=f"{cost.server} adds {cost.added_ms:.2f} ms per token (+{cost.added_pct:.0f} %) "
        f"over {cost.bench} on the same file and settings",
        component="engine",
        severity="info",
        evidence=[
            f"{cost.server} single-stream step {cost.server_step_ms:.3f} ms (measured here)",
            f"{cost.bench} tg at depth 0: {cost.bench_step_ms:.3f} ms per token ({cost.source})",
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
