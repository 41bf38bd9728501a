"""Per-request numbers from a raw stream, and the per-run summary from many requests.

Definitions (the same as ``vllm bench serve`` where they overlap):
- TTFT: send -> first chunk carrying output (text, reasoning, or token ids).
- TTFCT: send -> first chunk carrying *content* (not reasoning): what a user sees first.
- ITL: gaps between successive output-carrying chunks (one per chunk, not per token).
- E2E: send -> last output-carrying chunk.
- TPOT = (E2E - TTFT) / (tokens - 1); decode tok/s per stream = 1000 / TPOT(ms).
- tokens: server ``usage.completion_tokens`` when present, else token ids, else chunk count.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from ceiling.bench.stats import describe
from ceiling.bench.stream import RawStream

#: An inter-chunk gap below this (ms) means two chunks were delivered together.
BURST_ITL_MS = 0.05


class RequestRecord(BaseModel):
    """One request, measured. Times in ms relative to the send (``t_send_s`` is absolute)."""

    index: int
    repeat: int = 0
    turn: int | None = None  # 1.. within a multi-turn session (--turns); None: no sessions
    t_send_s: float
    ok: bool
    error_kind: str | None = None
    error: str | None = None
    status: int = 0
    prompt_tokens: int | None = None
    prompt_tokens_expected: int | None = None
    max_tokens: int | None = None
    output_tokens: int = 0
    output_tokens_source: str = "chunks"
    chunks: int = 0
    reasoning_chunks: int = 0
    usage_tokens: int | None = None
    usage_mismatch: bool = False
    finish_reason: str | None = None
    # llama-server's own word for why generation ended (its native /completion stream: "eos",
    # "limit", "word"); OpenAI-style streams carry finish_reason only
    stop_type: str | None = None
    short: bool = False
    ttft_ms: float | None = None
    ttfct_ms: float | None = None
    e2el_ms: float | None = None
    tpot_ms: float | None = None
    decode_tok_s: float | None = None
    itl_ms: list[float] = Field(default_factory=list)
    chunk_ms: list[float] = Field(default_factory=list)
    chunk_tokens: list[int] | None = None
    malformed_chunks: int = 0


class EarlyEnd(BaseModel):
    """Completed requests that ended before their max_tokens, for one reason the server gave.

    ``prompt_tokens``/``output_tokens``: the most common pair among them (what a warning
    quotes: "prompt 128 + 384 generated = 512")."""

    finish_reason: str = Field(description="the server's finish_reason (none: it gave none)")
    stop_type: str | None = Field(None, description="llama-server's stop_type, when sent")
    requests: int
    max_tokens: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int = 0


def _choice_output(choice: dict[str, Any]) -> tuple[bool, bool, int | None, str | None]:
    """(has content, has reasoning, token-id count, finish reason) of one streamed choice."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        content = delta.get("content")
        reasoning = delta.get("reasoning") or delta.get("reasoning_content")
    else:
        content = choice.get("text")
        reasoning = None
    ids = choice.get("token_ids")
    n_ids = len(ids) if isinstance(ids, list) else None
    return bool(content), bool(reasoning), n_ids, choice.get("finish_reason")


def process(
    raw: RawStream,
    index: int,
    *,
    max_tokens: int | None,
    prompt_tokens_expected: int | None = None,
    keep_chunks: bool = True,
) -> RequestRecord:
    """Parse a finished stream into a :class:`RequestRecord` (all JSON work happens here)."""
    t0 = raw.t_send_ns
    rec = RequestRecord(
        index=index,
        t_send_s=t0 / 1e9,
        ok=False,
        status=raw.status,
        error_kind=raw.error_kind,
        error=raw.error,
        max_tokens=max_tokens,
        prompt_tokens_expected=prompt_tokens_expected,
    )
    token_times: list[int] = []
    token_counts: list[int] = []
    first_content: int | None = None
    done = False
    ids_total = 0
    ids_seen = False
    for t, payload in raw.events:
        if payload == b"[DONE]":
            done = True
            continue
        try:
            obj = json.loads(payload)
        except (json.JSONDecodeError, UnicodeDecodeError):
            rec.malformed_chunks += 1
            continue
        if not isinstance(obj, dict):
            rec.malformed_chunks += 1
            continue
        if "error" in obj or obj.get("object") == "error":
            err = obj.get("error", obj)
            msg = err.get("message") if isinstance(err, dict) else err
            rec.error_kind = rec.error_kind or "stream_error"
            rec.error = rec.error or f"error event in stream: {str(msg)[:300]}"
            continue
        if isinstance(obj.get("stop_type"), str) and obj["stop_type"] != "none":
            rec.stop_type = obj["stop_type"]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            bad = {
                k: usage[k]
                for k in ("completion_tokens", "prompt_tokens")
                if isinstance(usage.get(k), int) and not isinstance(usage[k], bool) and usage[k] < 0
            }
            if bad:  # a server that counts below zero: no number of this request is trusted
                rec.error_kind = rec.error_kind or "bad_usage"
                rec.error = rec.error or f"the server's usage holds negative counts: {bad}"
                continue
            if isinstance(usage.get("completion_tokens"), int):
                rec.usage_tokens = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                rec.prompt_tokens = usage["prompt_tokens"]
        choices = obj.get("choices")
        if not isinstance(choices, list):
            continue
        has_out = False
        n_tok = 0
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            content, reasoning, n_ids, finish = _choice_output(choice)
            if finish:
                rec.finish_reason = finish
            if n_ids is not None:
                ids_seen = True
                ids_total += n_ids
                n_tok += n_ids
            if content or reasoning or n_ids:
                has_out = True
                if reasoning and not content:
                    rec.reasoning_chunks += 1
            if content and first_content is None:
                first_content = t
        if has_out:
            token_times.append(t)
            token_counts.append(max(n_tok, 1))
    rec.chunks = len(token_times)
    if rec.usage_tokens is not None:
        rec.output_tokens, rec.output_tokens_source = rec.usage_tokens, "usage"
    elif ids_seen:
        rec.output_tokens, rec.output_tokens_source = ids_total, "token_ids"
    else:
        rec.output_tokens, rec.output_tokens_source = rec.chunks, "chunks"
    counted = ids_total if ids_seen else rec.chunks
    rec.usage_mismatch = rec.usage_tokens is not None and rec.usage_tokens != counted
    if token_times:
        rec.ttft_ms = (token_times[0] - t0) / 1e6
        rec.e2el_ms = (token_times[-1] - t0) / 1e6
        rec.itl_ms = [(b - a) / 1e6 for a, b in itertools.pairwise(token_times)]
        if first_content is not None:
            rec.ttfct_ms = (first_content - t0) / 1e6
        if rec.output_tokens > 1:
            rec.tpot_ms = (rec.e2el_ms - rec.ttft_ms) / (rec.output_tokens - 1)
            if rec.tpot_ms > 0:
                rec.decode_tok_s = 1000.0 / rec.tpot_ms
        if keep_chunks:
            rec.chunk_ms = [(t - t0) / 1e6 for t in token_times]
            if any(c != 1 for c in token_counts):
                rec.chunk_tokens = token_counts
    if rec.malformed_chunks and rec.error_kind is None and not token_times:
        rec.error_kind = "malformed_sse"
        rec.error = f"{rec.malformed_chunks} unparseable SSE chunk(s) and no output"
    if rec.error_kind is None and not (done or rec.finish_reason):
        rec.error_kind = "incomplete"
        rec.error = "stream ended without finish_reason or [DONE]"
    rec.ok = rec.error_kind is None
    if rec.ok and max_tokens:
        rec.short = rec.output_tokens < max_tokens
    return rec


def errors_by_kind(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Failed requests per error kind, plus ``malformed_sse`` chunks that were skipped."""
    counts: Counter[str] = Counter(r.error_kind for r in records if r.error_kind)
    malformed = sum(r.malformed_chunks for r in records if r.error_kind != "malformed_sse")
    if malformed:
        counts["malformed_sse_chunks"] += malformed
    return dict(sorted(counts.items()))


#: Distinct error texts kept per level; the rest are counted under :data:`OTHER_MESSAGES`
#: (a server that puts a request id in every message must not grow the result per request).
MAX_ERROR_MESSAGES = 20
OTHER_MESSAGES = "(other messages)"


def error_messages(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Each distinct error text of the failed requests with how many ended with it, most
    common first: the server's own words ("Context size has been exceeded.") travel with
    every result, not only with ``--save-detailed``."""
    counts: Counter[str] = Counter(
        " ".join((r.error or r.error_kind or "").split()) for r in records if r.error_kind
    )
    out = dict(counts.most_common(MAX_ERROR_MESSAGES))
    rest = sum(counts.values()) - sum(out.values())
    if rest:
        out[OTHER_MESSAGES] = rest
    return out


def early_ends(records: Sequence[RequestRecord]) -> list[EarlyEnd]:
    """The completed requests that ended before max_tokens, grouped by the server's reason."""
    groups: dict[tuple[str, str | None], list[RequestRecord]] = {}
    for r in records:
        if r.ok and r.short:
            groups.setdefault((r.finish_reason or "none", r.stop_type), []).append(r)
    out = []
    for (reason, stop_type), rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        shape = Counter(
            (r.prompt_tokens or r.prompt_tokens_expected, r.output_tokens, r.max_tokens) for r in rs
        )
        (prompt, output, max_t), _ = shape.most_common(1)[0]
        out.append(
            EarlyEnd(
                finish_reason=reason,
                stop_type=stop_type,
                requests=len(rs),
                max_tokens=max_t,
                prompt_tokens=prompt,
                output_tokens=output,
            )
        )
    return out


def finish_reasons(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Completed requests per ``finish_reason`` the server gave (``none``: it gave none)."""
    counts: Counter[str] = Counter(r.finish_reason or "none" for r in records if r.ok)
    return dict(sorted(counts.items()))


def steady_state(records: Sequence[RequestRecord], level: int | None) -> tuple[float, float]:
    """(output tok/s, seconds) over the time when ``level`` streams were all decoding at once.

    Needs chunk timestamps. Outside that window the run ramps up or drains, which depresses
    throughput; reporting it separately keeps the headline number honest. ``level`` None
    means: the highest number of streams that were decoding together.
    """
    ok = [r for r in records if r.ok and r.chunk_ms and len(r.chunk_ms) > 1]
    if not ok:
        return 0.0, 0.0
    edges: list[tuple[float, int]] = []
    for r in ok:
        base = r.t_send_s * 1000.0
        edges.append((base + r.chunk_ms[0], +1))
        edges.append((base + r.chunk_ms[-1], -1))
    edges.sort(key=lambda e: (e[0], e[1]))
    active, peak = 0, 0
    for _, d in edges:
        active += d
        peak = max(peak, active)
    target = min(level, peak) if level else peak
    windows: list[tuple[float, float]] = []
    active, start = 0, None
    for t, d in edges:
        active += d
        if active >= target and start is None:
            start = t
        elif active < target and start is not None:
            windows.append((start, t))
            start = None
    span_ms = sum(b - a for a, b in windows)
    if span_ms <= 0:
        return 0.0, 0.0
    starts = np.asarray([a for a, _ in windows])
    ends = np.asarray([b for _, b in windows])
    tokens = 0.0
    for r in ok:
        base = r.t_send_s * 1000.0
        # Tokens after the first chunk (the first chunk ends prefill, not decode).
        times = np.asarray(r.chunk_ms[1:]) + base
        weights = np.asarray(r.chunk_tokens[1:]) if r.chunk_tokens else np.ones(len(times))
        counted = sum(r.chunk_tokens) if r.chunk_tokens else len(r.chunk_ms)
        if r.output_tokens and counted and r.output_tokens != counted:
            # Usage says more tokens than chunks (multi-token chunks): spread them evenly.
            weights = weights * (r.output_tokens / counted)
        idx = np.searchsorted(starts, times, side="right") - 1
        inside = (idx >= 0) & (times <= ends[np.clip(idx, 0, None)])
        tokens += float(weights[inside].sum())
    return tokens / (span_ms / 1000.0), span_ms / 1000.0


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    level: int | None = None,
    steady: bool = True,
    percentiles: Sequence[float] = (50, 90, 99),
) -> dict[str, Any]:
    """Run-level summary with ``vllm bench serve`` key names plus ours.

    ``steady`` False (send times not on one clock): no steady-state window. ``percentiles``:
    the ``p<N>_<metric>_ms`` keys reported (``p99.9_ttft_ms`` for 99.9, as vLLM's)."""
    ok = [r for r in records if r.ok]
    out: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(records) - len(ok),
    }
    total_in = sum((r.prompt_tokens or r.prompt_tokens_expected or 0) for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    out["total_input_tokens"] = total_in
    out["total_output_tokens"] = total_out
    dur = duration_s if duration_s > 0 else float("nan")
    out["request_throughput"] = len(ok) / dur if duration_s > 0 else None
    out["output_throughput"] = total_out / dur if duration_s > 0 else None
    out["total_token_throughput"] = (total_in + total_out) / dur if duration_s > 0 else None
    series = {
        "ttft": [r.ttft_ms for r in ok if r.ttft_ms is not None],
        "tpot": [r.tpot_ms for r in ok if r.tpot_ms is not None],
        "itl": [x for r in ok for x in r.itl_ms],
        "e2el": [r.e2el_ms for r in ok if r.e2el_ms is not None],
        "ttfct": [r.ttfct_ms for r in ok if r.ttfct_ms is not None],
    }
    for name, vals in series.items():
        d = describe(vals, percentiles)
        for stat, value in d.items():
            if stat not in ("min", "max"):
                out[f"{stat}_{name}_ms"] = value
    mean_tpot = out["mean_tpot_ms"]
    out["decode_tok_s_per_stream"] = 1000.0 / mean_tpot if mean_tpot else None
    itls = series["itl"]
    # Chunks that arrived (almost) together with the previous one: burst delivery by a
    # starved server frontend or client, which makes client-side TPOT understate the step.
    out["burst_chunk_share"] = (
        sum(1 for x in itls if x < BURST_ITL_MS) / len(itls) if itls else None
    )
    chunks = sum(r.chunks for r in ok)
    out["tokens_per_chunk"] = total_out / chunks if chunks else None
    out["usage_mismatches"] = sum(1 for r in ok if r.usage_mismatch)
    out["usage_missing"] = sum(1 for r in ok if r.usage_tokens is None)
    out["short_requests"] = sum(1 for r in ok if r.short)
    out.update(prompt_offsets(ok))
    out["reasoning_chunks"] = sum(r.reasoning_chunks for r in ok)
    tput, span = steady_state(records, level) if steady else (0.0, 0.0)
    out["steady_state_output_throughput"] = tput if span > 0 else None
    out["steady_state_duration"] = span
    return out


def _constant(diffs: list[int]) -> int | None:
    """The one value of ``diffs`` when they are all equal (None: none, or they vary)."""
    return diffs[0] if diffs and len(set(diffs)) == 1 else None


def prompt_offsets(ok: list[RequestRecord]) -> dict[str, Any]:
    """The server's own prompt count (usage) against the length each request was built to have.

    A constant difference is the server's framing (a BOS token it adds, a chat template), kept as
    ``prompt_tokens_offset``; a later turn of a session (``--turns``) has its own constant, as its
    intended length already holds the server's count of its history (framing included):
    ``later_turn_tokens_offset``. ``prompt_tokens_varied``: the differences are not constant
    within those two groups (a re-tokenized history or text), which a run warns about."""
    firsts: list[int] = []
    laters: list[int] = []
    for r in ok:
        if r.prompt_tokens is not None and r.prompt_tokens_expected is not None:
            group = laters if (r.turn or 1) > 1 else firsts
            group.append(r.prompt_tokens - r.prompt_tokens_expected)
    diffs = firsts + laters
    first, later = _constant(firsts), _constant(laters)
    return {
        "prompt_tokens_checked": len(diffs),
        "prompt_tokens_mismatches": sum(1 for d in diffs if d),
        "prompt_tokens_diff": [min(diffs), max(diffs)] if any(diffs) else None,
        "prompt_tokens_offset": first,
        "later_turn_tokens_offset": later,
        "prompt_tokens_varied": (bool(firsts) and first is None)
        or (bool(laters) and later is None),
    }
