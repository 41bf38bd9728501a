"""From measurements to the result: per-level summaries, CIs, server deltas, warnings.

The runner measures (levels x repeats, raw streams parsed afterwards); this module turns those
measurements into :class:`~ceiling.bench.results.LevelResult` objects and the plain-language
warnings that travel with a result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ceiling.bench import server_metrics
from ceiling.bench.causes import early_end_warning, failed_warning
from ceiling.bench.config import BenchConfig
from ceiling.bench.metrics import (
    RequestRecord,
    early_ends,
    error_messages,
    errors_by_kind,
    finish_reasons,
    summarize,
)
from ceiling.bench.results import CI_METRICS, LevelResult, PerRequest, Summary, WorkerInfo
from ceiling.bench.slo import checks, goodput, percentiles_for
from ceiling.bench.stats import mean_ci
from ceiling.fmt import pct, share

#: Loop lag (p99) above this share of the mean ITL gets a warning.
LAG_WARN_SHARE = 0.10
#: Share of chunks delivered in bursts above which we warn.
BURST_WARN_SHARE = 0.2


@dataclass
class Measurement:
    """One level of one repeat: its parsed requests, wall time and /metrics delta."""

    repeat: int
    level: int | None
    records: list[RequestRecord]
    duration_s: float
    metrics_delta: dict[str, float] | None
    metrics_missing: str | None = None  # why there is no delta, when it is not "no endpoint"
    aligned: bool = True  # send times of all workers on one clock (steady-state windows)


def _token_weighted_tpot(records: list[RequestRecord]) -> float | None:
    """Sum of decode time over sum of decode tokens: comparable to a per-token server histogram."""
    num = sum((r.e2el_ms or 0) - (r.ttft_ms or 0) for r in records if r.ok and r.output_tokens > 1)
    den = sum(r.output_tokens - 1 for r in records if r.ok and r.output_tokens > 1)
    return num / den if den else None


def _summary(
    cfg: BenchConfig,
    records: list[RequestRecord],
    duration_s: float,
    level: int | None,
    steady: bool,
) -> dict[str, Any]:
    """summarize() with the chosen percentiles, plus goodput when SLOs are given."""
    out = summarize(records, duration_s, level, steady, percentiles_for(cfg.percentiles, cfg.slo))
    if cfg.slo:
        out["good_completed"], out["request_goodput"] = goodput(records, cfg.slo, duration_s)
    return out


def level_result(cfg: BenchConfig, level: int | None, ms: list[Measurement]) -> LevelResult:
    """Pooled summary over repeats, per-repeat summaries, CIs across repeats, server deltas."""
    records = [r for m in ms for r in m.records]
    aligned = all(m.aligned for m in ms)
    pooled = _summary(cfg, records, sum(m.duration_s for m in ms), level, aligned)
    repeats = [Summary(**_summary(cfg, m.records, m.duration_s, level, m.aligned)) for m in ms]
    slo = checks(pooled, records, cfg.slo)
    ci = {
        k: mean_ci([getattr(s, k) for s in repeats if getattr(s, k) is not None])
        for k in CI_METRICS
    }
    delta: dict[str, float] | None = {}
    for m in ms:
        delta = server_metrics.add_deltas(delta, m.metrics_delta)
    client_means = {
        "ttft": pooled["mean_ttft_ms"],
        "itl": _token_weighted_tpot(records),
        "e2el": pooled["mean_e2el_ms"],
    }
    ok = [r for r in records if r.ok]
    return LevelResult(
        **pooled,
        concurrency=level,
        request_rate=cfg.rate if level is None else None,
        burstiness=cfg.burstiness if level is None else None,
        errors=errors_by_kind(records),
        error_messages=error_messages(records),
        finish_reasons=finish_reasons(records),
        early_ends=early_ends(records),
        ci=ci,
        slo=slo,
        slo_met=all(c.met for c in slo) if slo else None,
        repeats=repeats,
        server_metrics=server_metrics.compare_to_client(
            delta or None,
            client_means,
            missing=next((m.metrics_missing for m in ms if m.metrics_missing), None),
        ),
        per_request=PerRequest(
            repeat=[r.repeat for r in ok],
            tpot_ms=[r.tpot_ms for r in ok],
            ttft_ms=[r.ttft_ms for r in ok],
            e2el_ms=[r.e2el_ms for r in ok],
            output_tokens=[r.output_tokens for r in ok],
            itl_sum_ms=[sum(r.itl_ms) for r in ok],
            itl_count=[len(r.itl_ms) for r in ok],
        ),
        requests=records if cfg.save_detailed else None,
    )


#: Counts that add up over levels: the top level of a multi-level run carries their totals.
_TOTALS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens")


def run_head(levels: list[LevelResult]) -> dict[str, Any]:
    """The top-level fields of a run. One level: that level (a single-stream result reads like
    a ``vllm bench serve`` one). Several: the totals over every level and no per-level figure
    (a mean or rate of the first level passed off as the run's would mislead: read ``levels``).
    Error kinds, messages and finish reasons are summed over every level either way."""
    if len(levels) == 1:
        head = levels[0].model_dump()
    else:
        head = {k: sum(getattr(lv, k) for lv in levels) for k in _TOTALS}
    for key in ("errors", "error_messages", "finish_reasons"):
        total: dict[str, int] = {}
        for lv in levels:
            for k, v in getattr(lv, key).items():
                total[k] = total.get(k, 0) + v
        by_count = key == "error_messages"  # the most common message first, kinds by name
        head[key] = dict(sorted(total.items(), key=lambda kv: -kv[1] if by_count else kv[0]))
    return head


def _prompt_len_warning(extra: dict[str, Any]) -> str:
    """Requests whose prompt the server counted (usage) at another length than intended."""
    n, of = extra["prompt_tokens_mismatches"], extra["prompt_tokens_checked"]
    low, high = extra.get("prompt_tokens_diff") or (0, 0)
    by = f"{low:+d}" if low == high else f"{low:+d} to {high:+d}"
    return (
        f"{n} of {of} requests reached the server with another prompt length than intended "
        f"(its usage prompt_tokens minus the intended length: {by} tokens; a BOS token or chat "
        "template adds a constant, a re-tokenized history or text varies): total_input_tokens "
        "holds the server's counts"
    )


def run_notes(levels: list[LevelResult]) -> list[str]:
    """What a run states without warning: a constant difference between the server's prompt
    count and the intended length (its framing: a BOS token, a chat template), said once."""
    out: list[str] = []
    for lv in levels:
        extra = lv.model_extra or {}
        if extra.get("prompt_tokens_varied", True):
            continue
        first, later = extra.get("prompt_tokens_offset"), extra.get("later_turn_tokens_offset")
        parts = []
        if first:
            parts.append(f"every prompt {first:+d} tokens")
        if later:
            parts.append(f"every later turn of a session {later:+d} tokens")
        if not parts:
            continue
        note = (
            f"the server counted {' and '.join(parts)} against the intended length, a constant: "
            "its own framing (a BOS token it adds, a chat template), recorded as "
            "prompt_tokens_offset (later_turn_tokens_offset); total_input_tokens holds the "
            "server's counts"
        )
        if note not in out:
            out.append(note)
    return out


def run_warnings(
    levels: list[LevelResult],
    lag_ms: dict[str, float | None],
    prompts_reused: bool,
    len_source: str,
    workers: list[WorkerInfo] | None = None,
    clock_aligned: bool = True,
    served_context: int | None = None,
    ignore_eos_sent: bool = True,
) -> list[str]:
    """Plain-language caveats about a run, from its levels and the client's loop lag (per
    worker with ``--workers``/``--ray``). ``served_context``: the context one request gets on
    the server (None: it does not say); ``ignore_eos_sent``: the requests carried ignore_eos."""
    out: list[str] = []
    for lv in levels:
        tag = f"c={lv.concurrency}: " if lv.concurrency is not None and len(levels) > 1 else ""
        extra = lv.model_extra or {}
        for end in lv.early_ends:
            warning = early_end_warning(end, lv.completed, served_context, ignore_eos_sent)
            out.append(tag + warning)
        if lv.completed and extra.get("usage_missing") == lv.completed:
            out.append(f"{tag}the server sent no usage chunk: output tokens counted from chunks")
        tpc = extra.get("tokens_per_chunk")
        if tpc and tpc > 1.05:
            out.append(
                f"{tag}{tpc:.2f} tokens per chunk on average (speculative decoding or "
                "held-back text): ITL is per chunk, TPOT per token"
            )
        if lv.failed:
            out.append(tag + failed_warning(lv.failed, lv.errors, lv.error_messages))
        if extra.get("prompt_tokens_mismatches") and extra.get("prompt_tokens_varied", True):
            out.append(tag + _prompt_len_warning(extra))
    for lv in levels:
        burst = (lv.model_extra or {}).get("burst_chunk_share")
        if burst is not None and burst > BURST_WARN_SHARE:
            tag = f"c={lv.concurrency}: " if lv.concurrency is not None and len(levels) > 1 else ""
            out.append(
                f"{tag}{share(burst)} of chunks arrived together with the previous one: tokens "
                "were delivered in bursts (a starved server frontend or client); client TPOT "
                "understates the decode step, compare server_metrics"
            )
    itls = [lv.mean_itl_ms for lv in levels if lv.mean_itl_ms]
    checks = [(f"worker {w.index} ({w.host}) ", w.loop_lag_ms) for w in workers or []]
    for who, lag in checks or [("client ", lag_ms)]:
        p99 = lag.get("p99")
        if itls and p99 is not None and p99 > LAG_WARN_SHARE * min(itls):
            out.append(
                f"{who}event-loop lag p99 {p99:.2f} ms is {pct(100 * p99 / min(itls))} of the "
                f"mean ITL ({min(itls):.2f} ms): the client is part of what was measured"
            )
    if not clock_aligned:
        out.append(
            "the clock offsets of some workers are unknown: durations come from the driver's "
            "clock and steady-state throughput is not reported"
        )
    if prompts_reused:
        out.append("synthetic prompts were reused: a prefix cache may have lowered TTFT")
    if len_source == "approximate":
        out.append(
            "the server has no /tokenize: input lengths are approximate "
            "(total_input_tokens comes from usage)"
        )
    return out
