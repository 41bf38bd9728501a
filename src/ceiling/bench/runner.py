"""Orchestration of a benchmark run: preflight, warm-up, levels x repeats, scrapes, result.

``run_bench`` is the one entry point (sync; runs its own event loop, uvloop when installed).
The load itself is driven by :mod:`ceiling.bench.load`, in this process or, with ``--workers``
/ ``--ray``, in worker processes (:mod:`ceiling.bench.workers`, :mod:`ceiling.bench.rayworkers`)
whose records are merged here. Failures of single requests are data (counted by kind); a dead
server or Ctrl-C ends the run early and whatever was measured is summarized, written and
marked ``partial`` (workers are told to stop and send back what they measured).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from ceiling import __version__, interrupts
from ceiling.bench import capacity, server_metrics
from ceiling.bench.assemble import (
    Measurement,
    level_result,
    run_head,
    run_notes,
    run_warnings,
)
from ceiling.bench.client import Client, RawStream
from ceiling.bench.config import BenchConfig
from ceiling.bench.dataset import Dataset, build_prompts, read_dataset
from ceiling.bench.load import (
    LoadState,
    PromptPool,
    RequestOptions,
    Sent,
    body_for,
    drive,
    send_one,
)
from ceiling.bench.looplag import LoopLagMonitor, lag_stats
from ceiling.bench.rayworkers import RayPool
from ceiling.bench.results import CapacityResult, LevelResult, RunResult, save_result
from ceiling.bench.telemetry import Telemetry
from ceiling.bench.workers import ProcessPool, merge, plan_shares
from ceiling.bench.workloads import Prompt
from ceiling.console import console, say
from ceiling.inputs import check_out_file
from ceiling.redact import redact

__all__ = ["BenchConfig", "RunResult", "run_bench"]

#: Seconds between progress lines when stderr is not a terminal.
HEARTBEAT_S = 5.0
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # a closed terminal too


def _on_sigint(
    state: LoadState, loop: asyncio.AbstractEventLoop, signum: int, previous: dict[int, Any]
) -> None:
    """First Ctrl-C (or SIGTERM, SIGHUP): stop and keep what was measured (said at once; a
    caller such as doctor learns of it through ``ceiling.interrupts``). A second one interrupts
    for real. The reason names the signal that came."""
    interrupts.note(signum, "stopping the bench, keeping what was measured")
    state.interrupted = True
    name = signal.Signals(signum).name
    state.stop("interrupted (Ctrl-C)" if signum == signal.SIGINT else f"terminated ({name})")
    _restore_handlers(loop, previous)


def _install_handlers(state: LoadState, loop: asyncio.AbstractEventLoop) -> dict[int, Any]:
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


def _raise_fd_limit(cfg: BenchConfig) -> None:
    """One socket per stream: lift the soft open-files limit (often 1024) towards the hard one
    so that 1000+ streams do not fail with EMFILE. Worker processes inherit it."""
    levels = [lv for lv in cfg.levels() if lv is not None]
    need = (max(levels) if levels else 4096) + 256
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource  # Unix only

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = need if hard == resource.RLIM_INFINITY else min(need, hard)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def run_bench(cfg: BenchConfig, progress: bool = True) -> RunResult:
    """Run the benchmark described by ``cfg``; write ``cfg.out`` when set; return the result.

    ``cfg.out`` is checked before the first request: a path that cannot be written is an error
    in a second, not after the whole measurement."""
    # before a request: a bad file fails in a second
    dataset = read_dataset(cfg.dataset, cfg.dataset_format) if cfg.dataset is not None else None
    check_out_file(cfg.out, "--out")  # after the inputs: a bad one leaves no folder behind
    _raise_fd_limit(cfg)
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    with contextlib.suppress(ImportError):
        import uvloop  # optional (the [fast] extra)

        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        result = runner.run(_run(cfg, progress, dataset))
    if cfg.out is not None:
        save_result(result, cfg.out)
    return result


async def _heartbeat(prog: Any, enabled: bool, every_s: float | None = None) -> None:
    """Without a terminal the bars draw nothing until the end: a line on stderr every few
    seconds says where the run stands (CI, nohup, a log file)."""
    if not enabled or console().is_terminal:
        return
    t0 = time.monotonic()
    while True:
        await asyncio.sleep(HEARTBEAT_S if every_s is None else every_s)
        live = [t for t in prog.tasks if not t.finished] or list(prog.tasks)[-1:]
        if live:
            t = live[-1]
            total = f"/{int(t.total)}" if t.total else ""
            say(
                f"bench: {t.description}: {int(t.completed)}{total} requests done "
                f"({time.monotonic() - t0:.0f} s)"
            )


def _progress(enabled: bool) -> Any:
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
    prompts: PromptPool
    state: LoadState
    prog: Any  # rich.progress.Progress (imported lazily)
    options: RequestOptions
    pool: Any = None  # ProcessPool | RayPool | None (in-process)
    prompts_reused: bool = False
    stamp_fallbacks: int = 0  # in worker processes (the driver's own client counts its own)


async def _run(cfg: BenchConfig, show_progress: bool, dataset: Dataset | None = None) -> RunResult:
    started = datetime.now(UTC)
    async with Client(cfg.url, timeout_s=cfg.timeout, stall_s=cfg.stall_timeout) as client:
        model = await client.detect_model(cfg.model)
        path = "/v1/chat/completions" if cfg.chat else "/v1/completions"
        state = LoadState(client=client)
        served_ctx, ctx_source = await client.served_context(model)
        max_tokens, clip_note = fit_default_max_tokens(cfg, served_ctx, ctx_source)
        if clip_note:
            state.notes.append(clip_note)
            say(f"bench: {clip_note}")
        options = RequestOptions(
            model=model,
            path=path,
            chat=cfg.chat,
            max_tokens=max_tokens,
            ignore_eos=cfg.ignore_eos,
            temperature=cfg.temperature,
            logit_bias=cfg.logit_bias,
        )
        loop = asyncio.get_running_loop()
        previous = _install_handlers(state, loop)
        pool = None
        try:
            prompts, reusable, len_source = await build_prompts(
                cfg, client, model, max_tokens, dataset
            )
            pool = await _start_pool(cfg, client.base)
            if pool is not None:
                state.on_stop.append(pool.stop)
            telemetry = Telemetry() if cfg.telemetry else None
            if telemetry:
                telemetry.start()
            lag = LoopLagMonitor()
            lag.start()
            measurements: list[Measurement] = []
            found: tuple[list[LevelResult], CapacityResult] | None = None
            with _progress(show_progress) as prog:
                pool_ = PromptPool(prompts, reusable)
                ctx = _Ctx(cfg, client, model, path, pool_, state, prog, options, pool)
                beat = asyncio.ensure_future(_heartbeat(prog, show_progress))
                try:
                    await _warmup(ctx)
                    if cfg.mode == "capacity":
                        found = await _capacity(ctx, measurements)
                    for rep in range(cfg.repeat if found is None else 0):
                        for level in cfg.levels():
                            if state.stopped:
                                break
                            measurements.append(await _measure(ctx, rep, level))
                finally:
                    beat.cancel()
            lag_ms = await lag.stop()
            tele = telemetry.stop() if telemetry else None
        finally:
            _restore_handlers(loop, previous)
            if pool is not None:
                await pool.close()
    return _assemble(
        ctx, started, len_source, measurements, lag_ms, tele, served_ctx, ctx_source, found
    )


async def _capacity(
    ctx: _Ctx, measurements: list[Measurement]
) -> tuple[list[LevelResult], CapacityResult]:
    """The capacity search (ceiling.bench.capacity), each level an open-loop run at its rate."""
    cfg = ctx.cfg

    async def measure(rate: float, n: int) -> LevelResult | None:
        if ctx.state.stopped:
            return None
        at = cfg.model_copy(update={"mode": "rate", "rate": rate, "requests": n, "duration": None})
        m = await _measure(ctx, 0, None, at)
        measurements.append(m)
        return level_result(at, None, [m])

    return await capacity.search(
        measure,
        start=cfg.rate or capacity.DEFAULT_START_RATE,
        tolerance=capacity.DEFAULT_TOLERANCE if cfg.tolerance is None else cfg.tolerance,
        precision=cfg.precision or capacity.DEFAULT_PRECISION,
        min_requests=cfg.requests or capacity.DEFAULT_LEVEL_REQUESTS,
        min_seconds=cfg.duration or capacity.DEFAULT_LEVEL_SECONDS,
    )


def fit_default_max_tokens(
    cfg: BenchConfig, served_ctx: int | None, source: str | None
) -> tuple[int, str | None]:
    """max_tokens for the run and the note when the mode's default was clipped to fit the
    served context (prompt + output); a ``--max-tokens`` the user gave is sent as given."""
    want = cfg.effective_max_tokens
    if cfg.max_tokens is not None or served_ctx is None or cfg.dataset is not None:
        return want, None
    longest = cfg.input_bounds()[1]
    room = served_ctx - longest
    if room < 1 or want <= room:  # a prompt that does not fit is the overflow check's to name
        return want, None
    return room, (
        f"max_tokens clipped from the {cfg.mode} default {want} to {room}: the server serves "
        f"{served_ctx} tokens of context per request ({source}) and prompts are "
        f"{'up to ' if longest != cfg.input_len else ''}{longest} tokens (pass --max-tokens to "
        "choose)"
    )


async def _start_pool(cfg: BenchConfig, url: str) -> Any:
    """Worker processes (``--workers N``) or Ray actors (``--ray``); None: in-process."""
    if cfg.ray:
        pool: Any = RayPool(cfg.ray, cfg.workers, url, cfg.timeout, cfg.stall_timeout)
    elif cfg.workers > 1:
        pool = ProcessPool(cfg.workers, url, cfg.timeout, cfg.stall_timeout)
    else:
        return None
    try:
        await pool.start()
    except BaseException:
        await pool.close()
        raise
    return pool


async def _send(ctx: _Ctx, prompt: Prompt, index: int, repeat: int) -> Sent:
    """Send one request in this process (the warm-up)."""
    body, max_t = body_for(prompt, ctx.options, ctx.state.ignore_eos)
    return await send_one(ctx.state, ctx.path, body, max_t, prompt, index, repeat)


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
                prompt = ctx.prompts.take(1)[0]
                sent = await _send(ctx, prompt, i, -1)
                overflow = state.overflow is not None  # named as such, never "rejects ignore_eos"
                if (
                    _rejects_extensions(sent.raw)
                    and state.ignore_eos
                    and cfg.ignore_eos
                    and not overflow
                ):
                    # An OpenAI-compatible server without vLLM's extensions: go on without them.
                    state.ignore_eos = False
                    state.notes.append(
                        "the server rejected ignore_eos/min_tokens (HTTP 400): requests were sent "
                        "without them, so generations may stop at EOS before max_tokens"
                    )
                    await _send(ctx, prompt, i, -1)
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


async def _measure(
    ctx: _Ctx, rep: int, level: int | None, at: BenchConfig | None = None
) -> Measurement:
    """One level of one repeat, between two /metrics scrapes (``at``: this level's options,
    when they are not the run's: a rate of the capacity search)."""
    cfg, state, pool = at or ctx.cfg, ctx.state, ctx.pool
    n = cfg.requests_for(level)
    label = f"c={level}" if level is not None else f"rate={cfg.rate:g}/s"
    if cfg.repeat > 1:
        label += f" repeat {rep + 1}/{cfg.repeat}"
    task = ctx.prog.add_task(label, total=n)
    before = await ctx.client.get_text("/metrics")
    options = ctx.options.model_copy(update={"ignore_eos": cfg.ignore_eos and state.ignore_eos})
    workers, start_ns = (pool.n, pool.start_ns()) if pool is not None else (1, 0)
    shares = plan_shares(cfg, level, rep, ctx.prompts, options, workers, start_ns)
    aligned = True
    if pool is None:
        out = await drive(shares[0], state, lambda: ctx.prog.advance(task))
        records = [item.record() for item in out.sent]
        duration = (out.end_ns - out.start_ns) / 1e9
        used, reused = out.used, out.prompts_reused
    else:
        t0 = time.perf_counter()
        outputs = await pool.run(shares, lambda k: ctx.prog.advance(task, k))
        merged = merge(outputs, pool.offsets_ns(), time.perf_counter() - t0)
        state.cancelled += merged.cancelled
        if merged.stop_reasons:
            state.stop(merged.stop_reasons[0])
        records, duration, aligned = merged.records, merged.duration_s, merged.aligned
        used, reused = merged.used, merged.prompts_reused
        ctx.stamp_fallbacks += merged.stamp_fallbacks
    if n is None:
        ctx.prompts.advance(used)  # open-ended shares cycled through windows of the pool
    ctx.prompts_reused = ctx.prompts_reused or reused
    after = await ctx.client.get_text("/metrics") if not state.stopped else None
    missing = None
    if before is not None and after is None:
        missing = (
            f"the run stopped before the closing /metrics scrape ({state.reason})"
            if state.stopped
            else "the server stopped answering /metrics during the run"
        )
    delta = server_metrics.delta(before, after)
    return Measurement(
        rep, level, records, duration, delta, metrics_missing=missing, aligned=aligned
    )


def _assemble(
    ctx: _Ctx,
    started: datetime,
    len_source: str,
    measurements: list[Measurement],
    lag_ms: dict[str, float | None],
    tele: dict[str, Any] | None,
    served_ctx: int | None = None,
    ctx_source: str | None = None,
    found: tuple[list[LevelResult], CapacityResult] | None = None,
) -> RunResult:
    cfg = ctx.cfg
    levels: list[LevelResult] = list(found[0]) if found is not None else []
    for level in cfg.levels() if found is None else []:
        ms = [m for m in measurements if m.level == level]
        if ms:
            levels.append(level_result(cfg, level, ms))
    head = run_head(levels)
    config = cfg.model_dump(mode="json")
    config["url"] = redact(config["url"])
    workers = ctx.pool.book.result() if ctx.pool is not None else []
    if ctx.pool is not None:  # the self-check that matters ran in the workers: pool it
        lag_ms = lag_stats(ctx.pool.book.all_lag_ns())
    aligned = all(m.aligned for m in measurements)
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
        served_context=served_ctx,
        served_context_source=ctx_source,
        timestamp_source=ctx.client.timestamp_source,
        partial=ctx.state.stopped,
        partial_reason=ctx.state.reason,
        context_overflow=ctx.state.overflow,
        stalled=ctx.state.stalled,
        interrupted=ctx.state.interrupted,
        cancelled_in_flight=ctx.state.cancelled,
        loop_lag_ms=lag_ms,
        telemetry=tele,
        workers=workers,
        clock_aligned=aligned,
        timestamp_fallbacks=ctx.stamp_fallbacks + ctx.client.timestamp_fallbacks,
        levels=levels,
        capacity=found[1] if found is not None else None,
    )
    reused = ctx.prompts.reused or ctx.prompts_reused
    result.notes = run_notes(levels)
    result.warnings = ctx.state.notes + run_warnings(
        levels,
        lag_ms,
        reused,
        len_source,
        workers,
        aligned,
        served_context=served_ctx,
        ignore_eos_sent=cfg.ignore_eos and ctx.state.ignore_eos,
    )
    chunks = sum(r.chunks for m in measurements for r in m.records)
    if result.timestamp_fallbacks > 0.01 * max(chunks, 1):
        result.warnings.append(
            f"{result.timestamp_fallbacks} socket reads (of ~{chunks} chunks) came without a "
            "kernel timestamp and were stamped when the event loop read them"
        )
    if ctx.state.stopped:
        result.warnings.insert(0, f"partial result: {ctx.state.reason}")
    return result
