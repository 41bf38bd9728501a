"""``bench --workers N``: the load split over N processes, each with its own event loop.

The driver (the ``ceiling bench`` process) keeps everything that is not timing: preflight,
prompts, warm-up, /metrics scrapes, telemetry, the result. Per level it cuts the load into
shares (:func:`plan_shares`: streams split evenly, requests in proportion to streams; open-loop
arrivals dealt round-robin from one seeded schedule) with one start instant on the system-wide
monotonic clock (``time.perf_counter_ns``, CLOCK_MONOTONIC on Linux), sends them out, and
merges what comes back (:func:`merge`): the per-request records themselves, so every
percentile is computed from the merged samples, never averaged across workers. Each worker
runs its own event-loop self-check (:class:`~ceiling.bench.looplag.LoopLagMonitor`), reported
per worker in ``workers`` and pooled in ``loop_lag_ms``.

Workers here are local processes (:class:`ProcessPool`); :mod:`ceiling.bench.rayworkers` puts
the same worker code in Ray actors on other hosts, with measured clock offsets.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import multiprocessing as mp
import os
import platform
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from ceiling.bench.client import Client
from ceiling.bench.config import BenchConfig
from ceiling.bench.load import LoadState, PromptPool, RequestOptions, Share, drive
from ceiling.bench.looplag import LoopLagMonitor, lag_stats
from ceiling.bench.metrics import RequestRecord
from ceiling.bench.results import WorkerInfo
from ceiling.bench.workloads import arrival_offsets
from ceiling.errors import CeilingError

#: How far ahead of "now" the driver sets a level's start: every worker has its share by then.
START_LEAD_S = 0.2
#: Workers report finished requests (for the progress bar) at most this often.
PROGRESS_EVERY_S = 0.25


class ShareOutput(BaseModel):
    """What one worker sends back for one share: parsed records and its clock readings."""

    worker: int
    records: list[RequestRecord] = Field(default_factory=list)
    start_ns: int = 0
    end_ns: int = 0
    used: int = 0
    cancelled: int = 0
    prompts_reused: bool = False
    stop_reason: str | None = None  # the worker stopped on its own (e.g. the server died)
    lag_ns: list[int] = Field(default_factory=list)
    stamp_fallbacks: int = 0  # reads stamped by the loop because the kernel gave no stamp


def host_info() -> dict[str, Any]:
    """Who a worker is: host, pid and boot id (same boot id = same CLOCK_MONOTONIC)."""
    boot = ""
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "boot_id": boot or f"{socket.gethostname()}-unknown",
        "python": platform.python_version(),
    }


# -- cutting a level into shares ---------------------------------------------------------------
def split_even(total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` integers differing by at most one (larger first)."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def split_proportional(total: int, weights: list[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainders; sums to ``total``)."""
    wsum = sum(weights)
    exact = [total * w / wsum for w in weights]
    out = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def plan_shares(
    cfg: BenchConfig,
    level: int | None,
    rep: int,
    prompts: PromptPool,
    options: RequestOptions,
    n_workers: int,
    start_ns: int = 0,
) -> list[Share]:
    """One level of one repeat as shares for ``n_workers`` workers (1: the in-process case).

    Closed loop: streams split evenly, requests in proportion to streams (contiguous
    indices). Open loop: one seeded schedule for the level, arrivals dealt round-robin, so the
    merged arrivals are exactly the single-process ones. ``start_ns`` 0 means "now".
    """
    n = cfg.requests_for(level)
    common = {"rep": rep, "start_ns": start_ns, "duration": cfg.duration, "options": options}
    common["reusable"] = prompts.reusable
    shares: list[Share] = []
    if level is not None:
        streams = [s for s in split_even(level, n_workers) if s]
        if n is not None:
            counts = split_proportional(n, streams)
            taken = prompts.take(n)
            first = 0
            for w, (s, c) in enumerate(zip(streams, counts, strict=True)):
                if c:
                    block = taken[first : first + c]
                    share = Share(
                        worker=w,
                        streams=min(s, c),
                        count=c,
                        first_index=first,
                        prompts=block,
                        **common,
                    )
                    shares.append(share)
                first += c
        else:
            k = len(streams)
            size = max(1, len(prompts.prompts) // k)
            for w, s in enumerate(streams):
                window = prompts.window(w, k, size)
                share = Share(
                    worker=w, streams=s, first_index=w, index_step=k, prompts=window, **common
                )
                shares.append(share)
        return shares
    assert cfg.rate is not None
    rng = np.random.default_rng(cfg.seed + 1000 * rep)
    count = n if n is not None else int(cfg.rate * (cfg.duration or 0) * 2) + 16
    offsets = arrival_offsets(count, cfg.rate, cfg.burstiness, rng).tolist()
    k = max(1, min(n_workers, count))
    pool_taken = prompts.take(n) if n is not None else None
    for w in range(k):
        mine = (
            pool_taken[w::k]
            if pool_taken is not None
            else prompts.window(w, k, len(prompts.prompts))
        )
        share = Share(
            worker=w, offsets=offsets[w::k], first_index=w, index_step=k, prompts=mine, **common
        )
        shares.append(share)
    return shares


# -- running a share (in a worker) -----------------------------------------------------------
async def run_share(
    share: Share, state: LoadState, on_done: Callable[[], None] | None = None
) -> ShareOutput:
    """Drive one share with an event-loop self-check beside it; parse once it is over."""
    lag = LoopLagMonitor()
    lag.start()
    misses = state.client.timestamp_fallbacks
    try:
        out = await drive(share, state, on_done)
    finally:
        await lag.stop()
    return ShareOutput(
        worker=share.worker,
        records=[s.record() for s in out.sent],
        start_ns=out.start_ns,
        end_ns=out.end_ns,
        used=out.used,
        cancelled=state.cancelled,
        prompts_reused=out.prompts_reused,
        stop_reason=state.reason if state.stopped and not state.reason_from_driver else None,
        lag_ns=lag.samples_ns,
        stamp_fallbacks=state.client.timestamp_fallbacks - misses,
    )


# -- merging ----------------------------------------------------------------------------------
@dataclass
class Merged:
    """A level's shares as one measurement (records on the driver's clock)."""

    records: list[RequestRecord]
    duration_s: float
    aligned: bool
    cancelled: int = 0
    used: int = 0
    prompts_reused: bool = False
    stop_reasons: list[str] = field(default_factory=list)
    stamp_fallbacks: int = 0


def merge(outputs: list[ShareOutput], offsets_ns: dict[int, int | None], wall_s: float) -> Merged:
    """Pool the shares' records. ``offsets_ns[worker]`` is the worker's clock minus the
    driver's (None: unknown); with every offset known, send times move to the driver's clock
    and the duration runs from the first start to the last end; otherwise the duration is the
    driver's own ``wall_s`` and the result is not ``aligned`` (no cross-worker windows)."""
    aligned = all(offsets_ns.get(o.worker) is not None for o in outputs)
    records: list[RequestRecord] = []
    starts, ends = [], []
    for o in outputs:
        off = offsets_ns.get(o.worker) or 0
        if off:
            for r in o.records:
                r.t_send_s -= off / 1e9
        records += o.records
        if o.start_ns:  # a worker that died sent no clock readings
            starts.append(o.start_ns - off)
            ends.append(o.end_ns - off)
    duration = (max(ends) - min(starts)) / 1e9 if aligned and starts else wall_s
    return Merged(
        records=records,
        duration_s=duration,
        aligned=aligned,
        cancelled=sum(o.cancelled for o in outputs),
        used=sum(o.used for o in outputs),
        prompts_reused=any(o.prompts_reused for o in outputs),
        stop_reasons=[o.stop_reason for o in outputs if o.stop_reason],
        stamp_fallbacks=sum(o.stamp_fallbacks for o in outputs),
    )


class WorkerBook:
    """Per-worker facts gathered over the run (for ``RunResult.workers``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.infos: dict[int, dict[str, Any]] = {}
        self.lag: dict[int, list[int]] = {}
        self.requests: dict[int, int] = {}
        self.streams: dict[int, int] = {}

    def add(self, share: Share, out: ShareOutput) -> None:
        w = out.worker
        self.lag.setdefault(w, []).extend(out.lag_ns)
        self.requests[w] = self.requests.get(w, 0) + len(out.records)
        self.streams[w] = max(self.streams.get(w, 0), share.streams or 0)

    def all_lag_ns(self) -> list[int]:
        return [x for v in self.lag.values() for x in v]

    def result(self) -> list[WorkerInfo]:
        out = []
        for w, info in sorted(self.infos.items()):
            out.append(
                WorkerInfo(
                    index=w,
                    kind=self.kind,
                    loop_lag_ms=lag_stats(self.lag.get(w, [])),
                    requests=self.requests.get(w, 0),
                    streams=self.streams.get(w, 0),
                    **{k: v for k, v in info.items() if k in WorkerInfo.model_fields},
                )
            )
        return out


# -- local worker processes -------------------------------------------------------------------
def _listen(conn: Any, loop: asyncio.AbstractEventLoop, deliver: Callable[[Any], None]) -> None:
    """Read ``conn`` in a thread and hand each message to ``deliver`` on ``loop`` (("eof",)
    when the other side is gone). A thread, not ``loop.add_reader``: uvloop makes a watched fd
    non-blocking, and multiprocessing's recv/send of a large message then fail half-way."""

    def run() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = ("eof",)
            try:
                loop.call_soon_threadsafe(deliver, msg)
            except RuntimeError:  # the loop is closed
                return
            if msg[0] == "eof":
                return

    threading.Thread(target=run, daemon=True, name="ceiling-bench-pipe").start()


def _worker_main(conn: Any, url: str, timeout_s: float, stall_s: float) -> None:
    """A worker process: its own event loop (uvloop when installed), shares from the pipe."""
    # Ctrl-C reaches the whole process group: the driver decides, and tells us ("stop").
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    loop_factory = None
    with contextlib.suppress(ImportError):
        import uvloop  # optional (the [fast] extra)

        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_worker_loop(conn, url, timeout_s, stall_s))


async def _worker_loop(conn: Any, url: str, timeout_s: float, stall_s: float) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
    current: list[LoadState] = []
    done = [0, 0]  # finished requests, and how many of them were reported

    def on_message(msg: tuple[Any, ...]) -> None:
        if msg[0] == "eof":  # the driver is gone: stop and leave
            msg = ("exit",)
        if msg[0] in ("stop", "exit") and current:
            current[0].stop_from_driver(msg[1] if len(msg) > 1 else "driver exited")
        if msg[0] != "stop":
            inbox.put_nowait(msg)

    def report() -> None:
        if done[0] != done[1]:
            with contextlib.suppress(OSError):
                conn.send(("progress", done[0] - done[1]))
            done[1] = done[0]
        loop.call_later(PROGRESS_EVERY_S, report)

    _listen(conn, loop, on_message)
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGTERM, lambda: on_term())

    def on_term() -> None:
        if current:
            current[0].stop_from_driver("terminated (SIGTERM)")
        inbox.put_nowait(("exit",))

    async with Client(url, timeout_s=timeout_s, stall_s=stall_s) as client:
        conn.send(("ready", host_info()))
        loop.call_later(PROGRESS_EVERY_S, report)
        while True:
            msg = await inbox.get()
            if msg[0] != "share":
                break
            share: Share = msg[1]
            state = LoadState(client)
            current[:] = [state]

            def tick() -> None:
                done[0] += 1

            out = await run_share(share, state, tick)
            current.clear()
            report()
            conn.send(("result", out))


class ProcessPool:
    """N local worker processes (spawned, so nothing of the driver's loop is inherited)."""

    kind = "process"

    def __init__(self, n: int, url: str, timeout_s: float, stall_s: float) -> None:
        self.n, self.url = n, url
        self.timeout_s, self.stall_s = timeout_s, stall_s
        self.book = WorkerBook(self.kind)
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._busy: set[int] = set()
        self._deliver: Callable[[int, tuple[Any, ...]], None] | None = None

    def _route(self, w: int, msg: tuple[Any, ...]) -> None:
        if self._deliver is not None:
            self._deliver(w, msg)

    def offsets_ns(self) -> dict[int, int | None]:
        return dict.fromkeys(range(self.n), 0)  # one host: one CLOCK_MONOTONIC

    def start_ns(self) -> int:
        return time.perf_counter_ns() + int(START_LEAD_S * 1e9)

    async def start(self) -> None:
        ctx = mp.get_context("spawn")
        for _ in range(self.n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_worker_main,
                args=(child, self.url, self.timeout_s, self.stall_s),
                daemon=True,
            )
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        loop = asyncio.get_running_loop()
        for w, conn in enumerate(self._conns):
            try:
                ready = await loop.run_in_executor(None, conn.poll, 60)
                msg = conn.recv() if ready else None
            except (EOFError, OSError):
                msg = None
            if not msg or msg[0] != "ready":
                raise CeilingError(
                    f"bench worker {w} did not start",
                    fix="run without --workers to see why; a script that calls run_bench with "
                    "workers must guard it with `if __name__ == '__main__':` (workers are spawned)",
                )
            info = {**msg[1], "same_host": True, "clock_basis": "same_host"}
            self.book.infos[w] = {**info, "clock_offset_ms": 0.0}
            _listen(conn, loop, functools.partial(self._route, w))

    async def run(
        self, shares: list[Share], on_progress: Callable[[int], None]
    ) -> list[ShareOutput]:
        """Send each share to its worker; collect the outputs (progress as it comes)."""
        loop = asyncio.get_running_loop()
        results: dict[int, ShareOutput] = {}
        finished: asyncio.Future[None] = loop.create_future()
        by_worker = {s.worker: s for s in shares}

        def on_message(w: int, msg: tuple[Any, ...]) -> None:
            if msg[0] == "progress":
                on_progress(msg[1])
            elif msg[0] == "result" and w in by_worker:
                results[w] = msg[1]
                self._busy.discard(w)
                if len(results) == len(by_worker) and not finished.done():
                    finished.set_result(None)
            elif msg[0] == "eof" and w in self._busy:
                # A dead worker ends the run (partial): the others stop and report.
                reason = f"bench worker {w} died"
                results[w] = ShareOutput(worker=w, stop_reason=reason)
                self._busy.discard(w)
                self.stop(reason)
                if len(results) == len(by_worker) and not finished.done():
                    finished.set_result(None)

        self._deliver = on_message
        for w, share in by_worker.items():
            self._busy.add(w)
            self._conns[w].send(("share", share))
        try:
            await finished
        finally:
            self._deliver = None
        for w, out in results.items():
            self.book.add(by_worker[w], out)
        return [results[w] for w in sorted(results)]

    def stop(self, reason: str) -> None:
        """Ask every busy worker to stop now and send back what it measured (thread-safe
        enough for a signal handler: one small write per worker)."""
        for w in list(self._busy):
            with contextlib.suppress(OSError, ValueError):
                self._conns[w].send(("stop", reason))

    async def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("exit",))
        loop = asyncio.get_running_loop()
        for proc in self._procs:
            await loop.run_in_executor(None, proc.join, 5)
            if proc.is_alive():
                proc.terminate()
                await loop.run_in_executor(None, proc.join, 5)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
