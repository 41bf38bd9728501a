"""``bench --ray ADDRESS``: the load's workers as Ray actors, on other hosts when one client
machine is not enough.

Each actor runs the same worker code as a local worker process (:func:`~ceiling.bench.
workers.run_share`) on its own event loop, in its own thread, with its own connection pool.
Hosts do not share a monotonic clock, so before every level the driver measures each actor's
offset with round trips (NTP's estimate: offset = t_actor - (t_sent + t_back) / 2 over the
round trip with the shortest time; uncertainty = half of it). Per-request figures (TTFT, ITL,
TPOT, E2E) never cross clocks; the offsets place each worker's start, send times, and the
level's duration on the driver's clock. An actor on the driver's host (same boot id) needs no
estimate: offset 0, exact. When a round trip is too slow to pin an offset down (uncertainty
above :data:`MAX_UNCERTAINTY_MS`), the offset is ``unknown``: that worker starts when its share
arrives, the duration comes from the driver, and no steady-state window is reported.

``ADDRESS`` is what ``ray.init`` takes (``auto``, ``host:port``, ``ray://host:10001``), or
``local`` to start a private Ray instance on this machine (shut down afterwards). ceiling and
its dependencies must be installed on every node; the server URL must be reachable from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from ceiling.bench.client import Client
from ceiling.bench.load import LoadState, Share
from ceiling.bench.workers import START_LEAD_S, ShareOutput, WorkerBook, host_info, run_share
from ceiling.errors import CeilingError

#: Round trips per clock estimate (the fastest one is kept).
CLOCK_PINGS = 9
#: An offset known less precisely than this is treated as unknown.
MAX_UNCERTAINTY_MS = 5.0
#: Ray start-up lead: a share must reach every actor before the level starts.
RAY_START_LEAD_S = max(START_LEAD_S, 0.5)
PROGRESS_POLL_S = 0.5


class BenchActor:
    """One worker in a Ray actor (threaded: ``stop``/``progress``/``clock`` answer while
    ``run`` is busy). The event loop (uvloop when installed) lives in its own thread."""

    def __init__(self, url: str, timeout_s: float, stall_s: float) -> None:
        factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
        with contextlib.suppress(ImportError):
            import uvloop  # optional (the [fast] extra)

            factory = uvloop.new_event_loop
        self._loop = factory()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client = Client(url, timeout_s=timeout_s, stall_s=stall_s)
        self._call(self._client.__aenter__())
        self._state: LoadState | None = None
        self._done = 0

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def info(self) -> dict[str, Any]:
        import ray  # heavy and optional (the [ray] extra): only --ray needs it

        return {**host_info(), "node": ray.get_runtime_context().get_node_id()}

    def clock(self) -> int:
        return time.perf_counter_ns()

    def progress(self) -> int:
        return self._done

    def run(self, share: Share) -> ShareOutput:
        async def go() -> ShareOutput:
            state = LoadState(self._client)
            self._state = state
            try:
                return await run_share(share, state, self._tick)
            finally:
                self._state = None

        return self._call(go())

    def _tick(self) -> None:
        self._done += 1

    def stop(self, reason: str) -> None:
        state = self._state
        if state is not None:
            self._loop.call_soon_threadsafe(state.stop_from_driver, reason)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call(self._client.__aexit__(None, None, None), timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)


def estimate_offset(samples: list[tuple[int, int, int]]) -> tuple[int, int]:
    """(offset ns, uncertainty ns) from (t_sent, t_actor, t_back) round trips: the fastest
    round trip bounds the offset best."""
    t1, tw, t2 = min(samples, key=lambda s: s[2] - s[0])
    return tw - (t1 + t2) // 2, (t2 - t1) // 2


class RayPool:
    """``n`` BenchActors spread over the cluster's nodes (``n`` < 2: one per alive node)."""

    kind = "ray"

    def __init__(self, address: str, n: int, url: str, timeout_s: float, stall_s: float) -> None:
        self.address, self.n, self.url = address, n, url
        self.timeout_s, self.stall_s = timeout_s, stall_s
        self.book = WorkerBook(self.kind)
        self._actors: list[Any] = []
        self._offsets: dict[int, int | None] = {}
        self._busy: set[int] = set()
        self._owned = False
        self._ray: Any = None
        self._driver = host_info()

    async def start(self) -> None:
        try:
            import ray  # see info()
        except ImportError as err:
            raise CeilingError(
                "--ray needs the `ray` package", fix="pip install 'ceiling[ray]'"
            ) from err
        self._ray = ray
        if not ray.is_initialized():
            try:
                if self.address == "local":
                    cpus = max(2, self.n + 1)
                    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
                else:
                    ray.init(address=self.address, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as err:
                raise CeilingError(
                    f"cannot join the Ray cluster at {self.address}: {err}".splitlines()[0],
                    fix="check the address (ray status on the head node), or use --ray local",
                ) from err
            self._owned = True
        if self.n < 2:
            self.n = max(1, sum(1 for node in ray.nodes() if node.get("Alive")))
        # Threaded actor (max_concurrency): stop/progress/clock answer while run is busy.
        options = {"num_cpus": 1, "max_concurrency": 4, "scheduling_strategy": "SPREAD"}
        actor_cls = ray.remote(BenchActor)
        self._actors = [
            actor_cls.options(**options).remote(self.url, self.timeout_s, self.stall_s)
            for _ in range(self.n)
        ]
        try:
            infos = await asyncio.wait_for(
                asyncio.gather(*(a.info.remote() for a in self._actors)), 120
            )
        except (TimeoutError, ray.exceptions.RayError) as err:
            raise CeilingError(
                f"Ray bench workers did not start: {err}".splitlines()[0],
                fix="ceiling must be installed on every node (pip install 'ceiling[ray]')",
            ) from err
        for w, info in enumerate(infos):
            self.book.infos[w] = {**info, "same_host": info["boot_id"] == self._driver["boot_id"]}
        await self._measure_clocks()

    async def _measure_clocks(self) -> None:
        """Offset of each actor's monotonic clock from the driver's (see the module doc)."""

        async def one(w: int) -> None:
            samples = []
            for _ in range(CLOCK_PINGS):
                t1 = time.perf_counter_ns()
                tw = await self._actors[w].clock.remote()
                samples.append((t1, tw, time.perf_counter_ns()))
            off, unc = estimate_offset(samples)
            info = self.book.infos[w]
            info["clock_offset_measured_ms"] = off / 1e6
            info["clock_uncertainty_ms"] = unc / 1e6
            if info["same_host"]:
                info["clock_basis"], info["clock_offset_ms"] = "same_host", 0.0
                self._offsets[w] = 0
            elif unc / 1e6 <= MAX_UNCERTAINTY_MS:
                info["clock_basis"], info["clock_offset_ms"] = "measured", off / 1e6
                self._offsets[w] = off
            else:
                info["clock_basis"], info["clock_offset_ms"] = "unknown", None
                self._offsets[w] = None

        await asyncio.gather(*(one(w) for w in range(len(self._actors))))

    def offsets_ns(self) -> dict[int, int | None]:
        return dict(self._offsets)

    def start_ns(self) -> int:
        return time.perf_counter_ns() + int(RAY_START_LEAD_S * 1e9)

    async def run(
        self, shares: list[Share], on_progress: Callable[[int], None]
    ) -> list[ShareOutput]:
        """Each share on its actor, its start moved onto that actor's clock."""
        ray = self._ray
        await self._measure_clocks()  # clocks of different hosts drift: once per level
        refs = {}
        for share in shares:
            w, off = share.worker, self._offsets.get(share.worker)
            # An unknown offset: start on arrival (the lead keeps workers roughly together).
            start = share.start_ns + off if off is not None else 0
            moved = share.model_copy(update={"start_ns": start})
            self._busy.add(w)
            refs[w] = self._actors[w].run.remote(moved)
        seen = dict.fromkeys(refs, 0)

        async def poll() -> None:
            while True:
                await asyncio.sleep(PROGRESS_POLL_S)
                for w in list(self._busy):
                    with contextlib.suppress(ray.exceptions.RayError):
                        done = await self._actors[w].progress.remote()
                        if done > seen[w]:
                            on_progress(done - seen[w])
                            seen[w] = done

        poller = asyncio.ensure_future(poll())
        outputs: list[ShareOutput] = []

        async def collect(w: int, ref: Any) -> None:
            try:
                out = await ref
            except ray.exceptions.RayError as err:
                reason = f"Ray bench worker {w} failed: {err}".splitlines()[0][:300]
                out = ShareOutput(worker=w, stop_reason=reason)
                self._busy.discard(w)
                self.stop(reason)  # a lost worker ends the run (partial): the others report
            self._busy.discard(w)
            outputs.append(out)

        try:
            await asyncio.gather(*(collect(w, r) for w, r in refs.items()))
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        by_worker = {s.worker: s for s in shares}
        for out in outputs:
            self.book.add(by_worker[out.worker], out)
        return sorted(outputs, key=lambda o: o.worker)

    def stop(self, reason: str) -> None:
        for w in list(self._busy):
            with contextlib.suppress(Exception):
                self._actors[w].stop.remote(reason)

    async def close(self) -> None:
        ray = self._ray
        if ray is None:
            return
        for actor in self._actors:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(actor.close.remote(), 15)
            with contextlib.suppress(Exception):
                ray.kill(actor)
        self._actors = []
        if self._owned and ray.is_initialized():
            ray.shutdown()
