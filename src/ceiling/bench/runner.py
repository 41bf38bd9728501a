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
from ceiling.bench.assemble import Measurement, level_result, run_warnings
from ceiling.bench.client import Client, RawStream
from ceiling.bench.config import BenchConfig
from ceiling.bench.looplag import LoopLagMonitor
from ceiling.bench.metrics import RequestRecord, process
from ceiling.bench.results import LevelResult, RunResult, save_result
from ceiling.bench.telemetry import Telemetry
from ceiling.bench.workloads import (
    Prompt,
    arrival_offsets,
    load_jsonl,
    request_body,
    synthetic_prompts,
)
from ceiling.redact import redact

__all__ = ["BenchConfig", "RunResult", "run_bench"]

#: Consecutive connection failures after which we check whether the server is still there.
DEAD_SERVER_STREAK = 3
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
    interrupted: bool = False  # stopped by Ctrl-C/SIGTERM (not by a dead server)
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


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _on_sigint(
    state: _State, loop: asyncio.AbstractEventLoop, signum: int, previous: dict[int, Any]
) -> None:
    """First Ctrl-C (or SIGTERM): stop and keep what was measured (said at once; a caller such
    as doctor learns of it through ``ceiling.interrupts``). A second one interrupts for real."""
    from ceiling import interrupts

    interrupts.note(signum, "stopping the bench, keeping what was measured")
    state.interrupted = True
    state.stop("interrupted (Ctrl-C)" if signum == signal.SIGINT else "terminated (SIGTERM)")
    _restore_handlers(loop, previous)


def _install_handlers(state: _State, loop: asyncio.AbstractEventLoop) -> dict[int, Any]:
    """Route SIGINT/SIGTERM to :func:`_on_sigint` while the loop runs; returns the handlers
    they replace (the CLI's), which :func:`_restore_handlers` puts back: asyncio's own removal
    would leave SIGTERM at its default, killing ceiling without a teardown."""
    previous: dict[int, Any] = {}
    for sig in _STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            previous[sig] = signal.getsignal(sig)
            loop.add_signal_handler(sig, _on_sigint, state, loop, sig, previous)
    return previous


def _restore_handlers(loop: asyncio.AbstractEventLoop, previous: dict[int, Any]) -> None:
    for sig, handler in list(previous.items()):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(sig)
            if handler is not None:
                signal.signal(sig, handler)
        previous.pop(sig, None)


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
    """Run the benchmark described by ``cfg``; write ``cfg.out`` when set; return the result.

    ``cfg.out`` is checked before the first request: a path that cannot be written is an error
    in a second, not after the whole measurement."""
    from ceiling.inputs import check_out_file

    check_out_file(cfg.out, "--out")
    dataset = load_jsonl(cfg.dataset) if cfg.dataset is not None else None  # before a request
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    with contextlib.suppress(ImportError):
        import uvloop

        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        result = runner.run(_run(cfg, progress, dataset))
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


async def _run(
    cfg: BenchConfig, show_progress: bool, dataset: list[Prompt] | None = None
) -> RunResult:
    started = datetime.now(UTC)
    async with Client(cfg.url, timeout_s=cfg.timeout, stall_s=cfg.stall_timeout) as client:
        model = await client.detect_model(cfg.model)
        path = "/v1/chat/completions" if cfg.chat else "/v1/completions"
        state = _State(client=client)
        loop = asyncio.get_running_loop()
        previous = _install_handlers(state, loop)
        try:
            prompts, len_source = await _prompts(cfg, client, model, dataset)
            telemetry = Telemetry() if cfg.telemetry else None
            if telemetry:
                telemetry.start()
            lag = LoopLagMonitor()
            lag.start()
            measurements: list[Measurement] = []
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
            _restore_handlers(loop, previous)
    return _assemble(ctx, started, len_source, measurements, lag_ms, tele)


async def _prompts(
    cfg: BenchConfig, client: Client, model: str, dataset: list[Prompt] | None = None
) -> tuple[_Prompts, str]:
    if dataset is not None or cfg.dataset is not None:
        loaded = dataset if dataset is not None else load_jsonl(cfg.dataset)  # type: ignore[arg-type]
        return _Prompts(loaded, reusable=True), "dataset"
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
        logit_bias=cfg.logit_bias,
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


async def _measure(ctx: _Ctx, rep: int, level: int | None) -> Measurement:
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
    missing = None
    if before is not None and after is None:
        missing = (
            f"the run stopped before the closing /metrics scrape ({state.reason})"
            if state.stopped
            else "the server stopped answering /metrics during the run"
        )
    delta = server_metrics.delta(before, after)
    return Measurement(rep, level, records, duration, delta, metrics_missing=missing)


def _assemble(
    ctx: _Ctx,
    started: datetime,
    len_source: str,
    measurements: list[Measurement],
    lag_ms: dict[str, float | None],
    tele: dict[str, Any] | None,
) -> RunResult:
    from ceiling import __version__

    cfg = ctx.cfg
    levels: list[LevelResult] = []
    for level in cfg.levels():
        ms = [m for m in measurements if m.level == level]
        if ms:
            levels.append(level_result(cfg, level, ms))
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
        interrupted=ctx.state.interrupted,
        cancelled_in_flight=ctx.state.cancelled,
        loop_lag_ms=lag_ms,
        telemetry=tele,
        levels=levels,
    )
    result.warnings = ctx.state.notes + run_warnings(levels, lag_ms, ctx.prompts.reused, len_source)
    if ctx.state.stopped:
        result.warnings.insert(0, f"partial result: {ctx.state.reason}")
    return result
