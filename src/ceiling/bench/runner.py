"""Orchestration of a benchmark run: preflight, warm-up, levels x repeats, scrapes, result.

``run_bench`` is the one entry point (sync; runs its own event loop, uvloop when installed).
Failures of single requests are data (counted by kind); a dead server or Ctrl-C ends the run
early and whatever was measured is summarized, written and marked ``partial``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import cycle
from typing import Any

import numpy as np

from ceiling.bench import server_metrics
from ceiling.bench.client import Client, RawStream, redact
from ceiling.bench.config import BenchConfig
from ceiling.bench.looplag import LoopLagMonitor
from ceiling.bench.metrics import RequestRecord, errors_by_kind, process, summarize
from ceiling.bench.results import (
    CI_METRICS,
    LevelResult,
    PerRequest,
    RunResult,
    Summary,
    save_result,
)
from ceiling.bench.stats import mean_ci
from ceiling.bench.telemetry import Telemetry
from ceiling.bench.workloads import (
    Prompt,
    arrival_offsets,
    load_jsonl,
    request_body,
    synthetic_prompts,
)

__all__ = ["BenchConfig", "RunResult", "run_bench"]

#: Consecutive connection failures after which we check whether the server is still there.
DEAD_SERVER_STREAK = 3
#: Loop lag (p99) above this share of the mean ITL gets a warning.
LAG_WARN_SHARE = 0.10
#: Share of chunks delivered in bursts above which we warn.
BURST_WARN_SHARE = 0.2
#: Prompt pool when the request count is open (``--duration``); reused cyclically beyond it.
OPEN_POOL = 512


@dataclass
class _Sent:
    """A finished request, not parsed yet."""

    raw: RawStream
    index: int
    repeat: int
    max_tokens: int
    expected_tokens: int | None

    def record(self) -> RequestRecord:
        rec = process(
            self.raw,
            self.index,
            max_tokens=self.max_tokens,
            prompt_tokens_expected=self.expected_tokens,
        )
        rec.repeat = self.repeat
        return rec


@dataclass
class _Measurement:
    repeat: int
    level: int | None
    records: list[RequestRecord]
    duration_s: float
    metrics_delta: dict[str, float] | None


@dataclass
class _State:
    """Shared run state: the stop signal, its reason, and the dead-server detector."""

    client: Client
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str | None = None
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    in_flight: int = 0
    cancelled: int = 0
    conn_streak: int = 0
    checking: bool = False
    ignore_eos: bool = True  # cleared when the server rejects the ignore_eos/min_tokens fields
    notes: list[str] = field(default_factory=list)

    @property
    def stopped(self) -> bool:
        return self.stop_event.is_set()

    def stop(self, reason: str) -> None:
        if self.stopped:
            return
        self.reason = reason
        self.stop_event.set()
        for task in list(self.tasks):
            task.cancel()

    async def observe(self, raw: RawStream) -> None:
        if raw.error_kind != "connection":
            self.conn_streak = 0
            return
        self.conn_streak += 1
        if self.conn_streak < DEAD_SERVER_STREAK or self.checking:
            return
        self.checking = True
        try:
            alive = await self.client.get_text("/v1/models", timeout_s=3.0) is not None
        finally:
            self.checking = False
        if alive:
            self.conn_streak = 0
        else:
            self.stop(f"server stopped answering ({raw.error})")


def _on_sigint(state: _State, loop: asyncio.AbstractEventLoop) -> None:
    """First Ctrl-C: stop and keep what was measured. A second one interrupts for real."""
    state.stop("interrupted (Ctrl-C)")
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        loop.remove_signal_handler(signal.SIGINT)


class _Prompts:
    """Hands out prompts in order; cycles (and says so) when the pool runs out."""

    def __init__(self, prompts: list[Prompt], reusable: bool) -> None:
        self._it: Iterator[Prompt] = cycle(prompts)
        self._n = len(prompts)
        self._used = 0
        self.reusable = reusable

    def next(self) -> Prompt:
        self._used += 1
        return next(self._it)

    @property
    def reused(self) -> bool:
        return self._used > self._n and not self.reusable


def run_bench(cfg: BenchConfig, progress: bool = True) -> RunResult:
    """Run the benchmark described by ``cfg``; write ``cfg.out`` when set; return the result."""
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    with contextlib.suppress(ImportError):
        import uvloop

        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        result = runner.run(_run(cfg, progress))
    if cfg.out is not None:
        save_result(result, cfg.out)
    return result


def _progress(enabled: bool) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from ceiling.console import console

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console(),
        disable=not enabled,
        # Rendering runs in a thread and takes the GIL from the event loop: keep it rare.
        refresh_per_second=2,
        transient=False,
    )


@dataclass
class _Ctx:
    """Everything a measurement needs, passed as one object."""

    cfg: BenchConfig
    client: Client
    model: str
    path: str
    prompts: _Prompts
    state: _State
    prog: Any  # rich.progress.Progress (imported lazily)


async def _run(cfg: BenchConfig, show_progress: bool) -> RunResult:
    started = datetime.now(UTC)
    async with Client(cfg.url, timeout_s=cfg.timeout, stall_s=cfg.stall_timeout) as client:
        model = await client.detect_model(cfg.model)
        path = "/v1/chat/completions" if cfg.chat else "/v1/completions"
        state = _State(client=client)
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGINT, _on_sigint, state, loop)
        try:
            prompts, len_source = await _prompts(cfg, client, model)
            telemetry = Telemetry() if cfg.telemetry else None
            if telemetry:
                telemetry.start()
            lag = LoopLagMonitor()
            lag.start()
            measurements: list[_Measurement] = []
            with _progress(show_progress) as prog:
                ctx = _Ctx(cfg, client, model, path, prompts, state, prog)
                await _warmup(ctx)
                for rep in range(cfg.repeat):
                    for level in cfg.levels():
                        if state.stopped:
                            break
                        measurements.append(await _measure(ctx, rep, level))
            lag_ms = await lag.stop()
            tele = telemetry.stop() if telemetry else None
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGINT)
    return _assemble(ctx, started, len_source, measurements, lag_ms, tele)


async def _prompts(cfg: BenchConfig, client: Client, model: str) -> tuple[_Prompts, str]:
    if cfg.dataset is not None:
        return _Prompts(load_jsonl(cfg.dataset), reusable=True), "dataset"
    counts = [cfg.requests_for(lv) for lv in cfg.levels()]
    if any(c is None for c in counts):
        total = OPEN_POOL
    else:
        total = cfg.warmup + cfg.repeat * sum(c for c in counts if c is not None)
    prompts, source = await synthetic_prompts(client, model, total, cfg.input_len, cfg.seed)
    return _Prompts(prompts, reusable=False), source


async def _send(ctx: _Ctx, index: int, repeat: int) -> _Sent:
    """Send one request. Parsing is deferred to the end of the measurement: JSON work while
    other streams are live would hold up the event loop and with it their timestamps."""
    cfg, state = ctx.cfg, ctx.state
    prompt = ctx.prompts.next()
    max_t = prompt.max_tokens or cfg.effective_max_tokens
    body = request_body(
        prompt,
        model=ctx.model,
        chat=cfg.chat,
        max_tokens=max_t,
        ignore_eos=cfg.ignore_eos and state.ignore_eos,
        temperature=cfg.temperature,
    )
    state.in_flight += 1
    try:
        raw = await ctx.client.stream(ctx.path, body)
    except asyncio.CancelledError:
        state.cancelled += 1
        raise
    finally:
        state.in_flight -= 1
    await state.observe(raw)
    return _Sent(raw, index, repeat, max_t, prompt.expected_tokens)


async def _warmup(ctx: _Ctx) -> None:
    """Warm-up requests (excluded from every number) at the first level's concurrency."""
    cfg, state = ctx.cfg, ctx.state
    if cfg.warmup <= 0:
        return
    task = ctx.prog.add_task("warm-up", total=cfg.warmup)
    sem = asyncio.Semaphore(max(1, min(cfg.warmup, cfg.levels()[0] or 1)))

    async def one(i: int) -> None:
        async with sem:
            if not state.stopped:
                sent = await _send(ctx, i, -1)
                if _rejects_extensions(sent.raw) and state.ignore_eos and cfg.ignore_eos:
                    # An OpenAI-compatible server without vLLM's extensions: go on without them.
                    state.ignore_eos = False
                    state.notes.append(
                        "the server rejected ignore_eos/min_tokens (HTTP 400): requests were sent "
                        "without them, so generations may stop at EOS before max_tokens"
                    )
                    await _send(ctx, i, -1)
                ctx.prog.advance(task)

    jobs = [asyncio.ensure_future(one(i)) for i in range(cfg.warmup)]
    state.tasks.update(jobs)
    await asyncio.gather(*jobs, return_exceptions=True)
    state.tasks.difference_update(jobs)
    state.cancelled = 0  # warm-up requests are not part of the measurement


def _rejects_extensions(raw: RawStream) -> bool:
    """A 400 whose message names one of the vLLM/SGLang request extensions we send."""
    text = (raw.error or "").lower()
    return raw.status == 400 and ("ignore_eos" in text or "min_tokens" in text)


async def _measure(ctx: _Ctx, rep: int, level: int | None) -> _Measurement:
    """One level of one repeat, between two /metrics scrapes."""
    cfg, state = ctx.cfg, ctx.state
    n = cfg.requests_for(level)
    label = f"c={level}" if level is not None else f"rate={cfg.rate:g}/s"
    if cfg.repeat > 1:
        label += f" repeat {rep + 1}/{cfg.repeat}"
    task = ctx.prog.add_task(label, total=n)
    before = await ctx.client.get_text("/metrics")
    sent: list[_Sent] = []

    async def send(i: int) -> None:
        sent.append(await _send(ctx, i, rep))
        ctx.prog.advance(task)

    t0 = time.perf_counter()
    deadline = t0 + cfg.duration if cfg.duration else math.inf
    jobs: list[asyncio.Future[Any]] = []
    if level is not None:
        counter = iter(range(n if n is not None else 2**62))

        async def worker() -> None:
            for i in counter:
                if state.stopped or time.perf_counter() >= deadline:
                    return
                await send(i)

        jobs = [asyncio.ensure_future(worker()) for _ in range(level)]
        state.tasks.update(jobs)
    else:
        assert cfg.rate is not None
        rng = np.random.default_rng(cfg.seed + 1000 * rep)
        count = n if n is not None else int(cfg.rate * (cfg.duration or 0) * 2) + 16
        for i, off in enumerate(arrival_offsets(count, cfg.rate, cfg.burstiness, rng)):
            if t0 + off >= deadline or state.stopped:
                break
            delay = t0 + off - time.perf_counter()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(state.stop_event.wait(), delay)
                if state.stopped:
                    break
            job = asyncio.ensure_future(send(i))
            jobs.append(job)
            state.tasks.add(job)
    await asyncio.gather(*jobs, return_exceptions=True)
    state.tasks.difference_update(jobs)
    duration = time.perf_counter() - t0
    after = await ctx.client.get_text("/metrics") if not state.stopped else None
    records = [item.record() for item in sent]
    return _Measurement(rep, level, records, duration, server_metrics.delta(before, after))


def _token_weighted_tpot(records: list[RequestRecord]) -> float | None:
    num = sum((r.e2el_ms or 0) - (r.ttft_ms or 0) for r in records if r.ok and r.output_tokens > 1)
    den = sum(r.output_tokens - 1 for r in records if r.ok and r.output_tokens > 1)
    return num / den if den else None


def _level_result(cfg: BenchConfig, level: int | None, ms: list[_Measurement]) -> LevelResult:
    records = [r for m in ms for r in m.records]
    pooled = summarize(records, sum(m.duration_s for m in ms), level)
    repeats = [Summary(**summarize(m.records, m.duration_s, level)) for m in ms]
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
        ci=ci,
        repeats=repeats,
        server_metrics=server_metrics.compare_to_client(delta or None, client_means),
        per_request=PerRequest(
            repeat=[r.repeat for r in ok],
            tpot_ms=[r.tpot_ms for r in ok],
            ttft_ms=[r.ttft_ms for r in ok],
            e2el_ms=[r.e2el_ms for r in ok],
            output_tokens=[r.output_tokens for r in ok],
        ),
        requests=records if cfg.save_detailed else None,
    )


def _warnings(
    levels: list[LevelResult], lag_ms: dict[str, float | None], prompts: _Prompts, len_source: str
) -> list[str]:
    out: list[str] = []
    for lv in levels:
        tag = f"c={lv.concurrency}: " if lv.concurrency is not None and len(levels) > 1 else ""
        extra = lv.model_extra or {}
        if extra.get("short_requests"):
            out.append(
                f"{tag}{extra['short_requests']} of {lv.completed} requests ended before "
                "max_tokens (EOS or a stop string): pass --ignore-eos or check the server"
            )
        if lv.completed and extra.get("usage_missing") == lv.completed:
            out.append(f"{tag}the server sent no usage chunk: output tokens counted from chunks")
        tpc = extra.get("tokens_per_chunk")
        if tpc and tpc > 1.05:
            out.append(
                f"{tag}{tpc:.2f} tokens per chunk on average (speculative decoding or "
                "held-back text): ITL is per chunk, TPOT per token"
            )
        if lv.failed:
            kinds = ", ".join(f"{k} {v}" for k, v in lv.errors.items())
            out.append(f"{tag}{lv.failed} failed requests ({kinds})")
    for lv in levels:
        share = (lv.model_extra or {}).get("burst_chunk_share")
        if share is not None and share > BURST_WARN_SHARE:
            tag = f"c={lv.concurrency}: " if lv.concurrency is not None and len(levels) > 1 else ""
            out.append(
                f"{tag}{share:.0%} of chunks arrived together with the previous one: tokens "
                "were delivered in bursts (a starved server frontend or client); client TPOT "
                "understates the decode step, compare server_metrics"
            )
    itls = [lv.mean_itl_ms for lv in levels if lv.mean_itl_ms]
    p99 = lag_ms.get("p99")
    if itls and p99 is not None and p99 > LAG_WARN_SHARE * min(itls):
        out.append(
            f"client event-loop lag p99 {p99:.2f} ms is {p99 / min(itls):.0%} of the "
            f"mean ITL ({min(itls):.2f} ms): the client is part of what was measured"
        )
    if prompts.reused:
        out.append("synthetic prompts were reused: a prefix cache may have lowered TTFT")
    if len_source == "approximate":
        out.append(
            "the server has no /tokenize: input lengths are approximate "
            "(total_input_tokens comes from usage)"
        )
    return out


def _assemble(
    ctx: _Ctx,
    started: datetime,
    len_source: str,
    measurements: list[_Measurement],
    lag_ms: dict[str, float | None],
    tele: dict[str, Any] | None,
) -> RunResult:
    from ceiling import __version__

    cfg = ctx.cfg
    levels: list[LevelResult] = []
    for level in cfg.levels():
        ms = [m for m in measurements if m.level == level]
        if ms:
            levels.append(_level_result(cfg, level, ms))
    head = levels[0].model_dump() if levels else {}
    errors: dict[str, int] = {}
    for lv in levels:
        for k, v in lv.errors.items():
            errors[k] = errors.get(k, 0) + v
    head["errors"] = errors
    config = cfg.model_dump(mode="json")
    config["url"] = redact(config["url"])
    result = RunResult(
        **head,
        date=started.isoformat(timespec="seconds"),
        ceiling_version=__version__,
        url=redact(ctx.client.base),
        endpoint=ctx.path,
        model_id=ctx.model,
        mode=cfg.mode,
        config=config,
        input_len_source=len_source,
        timestamp_source=ctx.client.timestamp_source,
        partial=ctx.state.stopped,
        partial_reason=ctx.state.reason,
        cancelled_in_flight=ctx.state.cancelled,
        loop_lag_ms=lag_ms,
        telemetry=tele,
        levels=levels,
    )
    result.warnings = ctx.state.notes + _warnings(levels, lag_ms, ctx.prompts, len_source)
    if ctx.state.stopped:
        result.warnings.insert(0, f"partial result: {ctx.state.reason}")
    return result
