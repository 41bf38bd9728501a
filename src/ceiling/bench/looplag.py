"""Event-loop lag monitor: how late the client's own loop wakes up during the run.

A client whose loop is busy timestamps chunks late; when that lag is a noticeable share of the
inter-token latency, the measured ITL/TPOT partly measure the client. Every few ms we queue a
callback with ``call_soon`` and record how long the loop took to run it: the time a chunk that
has just arrived would wait before being timestamped. (Timer oversleep is not used: libuv
timers have 1 ms granularity, which would read as lag.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():  # cancelled when the monitor stopped in between
        fut.set_result(None)


class LoopLagMonitor:
    """Start with :meth:`start`, stop with :meth:`stop` (returns mean/p99/max lag in ms)."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.samples_ns: list[int] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval_s)
            fut: asyncio.Future[None] = loop.create_future()
            t0 = time.perf_counter_ns()
            loop.call_soon(_resolve, fut)
            await fut
            self.samples_ns.append(time.perf_counter_ns() - t0)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> dict[str, float | None]:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return lag_stats(self.samples_ns)


def lag_stats(samples_ns: list[int]) -> dict[str, float | None]:
    """Mean, p99 and max of lag samples (ns) in ms; None without samples."""
    if not samples_ns:
        return {"mean": None, "p99": None, "max": None}
    arr = np.asarray(samples_ns, dtype=float) / 1e6
    return {
        "mean": float(arr.mean()),
        "p99": float(np.percentile(arr, 99)),
        "max": float(arr.max()),
    }
