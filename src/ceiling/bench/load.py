"""Driving load: one share of a level (closed-loop streams or an arrival schedule) on one loop.

The same code runs in-process (``--workers 1``), in each worker process and in each Ray actor
(:mod:`ceiling.bench.workers`). A :class:`Share` says what to send and when (``start_ns`` on
this host's ``time.perf_counter_ns`` clock, CLOCK_MONOTONIC on Linux); :func:`drive` sends it
and returns the raw streams, unparsed. Everything that can be done before the first send is:
request bodies are serialized and (closed loop) connections opened before ``start_ns``, so
that while streams are live the loop does little besides stamping socket reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count as _count
from typing import Any

from pydantic import BaseModel

from ceiling.bench.client import Client, RawStream
from ceiling.bench.failures import context_overflow
from ceiling.bench.metrics import RequestRecord, process
from ceiling.bench.workloads import Prompt, next_turn, request_body

#: Consecutive connection failures after which we check whether the server is still there.
DEAD_SERVER_STREAK = 3


class RequestOptions(BaseModel):
    """What every request of a run carries besides its prompt."""

    model: str
    path: str
    chat: bool = False
    max_tokens: int
    ignore_eos: bool = True
    temperature: float | None = None
    logit_bias: dict[str, float] | None = None


class Share(BaseModel):
    """One worker's part of one level of one repeat.

    Closed loop: ``streams`` concurrent streams send ``count`` requests (None: until
    ``duration`` runs out). Open loop: one request at each of ``offsets`` (s after start).
    Request ``k`` of the share has index ``first_index + k * index_step`` in the level and
    uses ``prompts[k % len(prompts)]`` (cycling counts as reuse unless ``reusable``).
    """

    worker: int = 0
    rep: int = 0
    streams: int | None = None
    count: int | None = None
    offsets: list[float] | None = None
    first_index: int = 0
    index_step: int = 1
    start_ns: int = 0
    duration: float | None = None
    prompts: list[Prompt]
    reusable: bool = False
    options: RequestOptions


class PromptPool:
    """The run's prompts, handed out in order; says when one was sent twice (a prefix cache
    could then flatter TTFT) unless the pool is a dataset (reuse expected)."""

    def __init__(self, prompts: list[Prompt], reusable: bool) -> None:
        self.prompts = prompts
        self.reusable = reusable
        self._pos = 0  # prompts handed out so far

    def take(self, k: int) -> list[Prompt]:
        """The next ``k`` prompts (cycling)."""
        n = len(self.prompts)
        out = [self.prompts[(self._pos + j) % n] for j in range(k)]
        self._pos += k
        return out

    def window(self, offset: int, stride: int, length: int) -> list[Prompt]:
        """Prompts ``offset, offset + stride, ...`` from the current position, without taking
        them: a share of unknown size cycles through these and reports how many it used."""
        n = len(self.prompts)
        return [self.prompts[(self._pos + offset + stride * j) % n] for j in range(length)]

    def advance(self, k: int) -> None:
        self._pos += k

    @property
    def reused(self) -> bool:
        return self._pos > len(self.prompts) and not self.reusable


@dataclass
class Sent:
    """A finished request, not parsed yet."""

    raw: RawStream
    index: int
    repeat: int
    max_tokens: int
    expected_tokens: int | None
    turn: int | None = None  # 1.. within a multi-turn session (--turns)

    def record(self) -> RequestRecord:
        rec = process(
            self.raw,
            self.index,
            max_tokens=self.max_tokens,
            prompt_tokens_expected=self.expected_tokens,
        )
        rec.repeat = self.repeat
        rec.turn = self.turn
        return rec


@dataclass
class LoadState:
    """Run state on one loop: the stop signal, its reason, and the dead-server detector.

    ``on_stop`` callbacks run once when the run stops (the worker pool uses it to stop its
    workers); ``tasks`` are cancelled.
    """

    client: Client
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str | None = None
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    on_stop: list[Callable[[str], None]] = field(default_factory=list)
    in_flight: int = 0
    cancelled: int = 0
    conn_streak: int = 0
    checking: bool = False
    interrupted: bool = False  # stopped by Ctrl-C/SIGTERM (not by a dead server)
    ignore_eos: bool = True  # cleared when the server rejects the ignore_eos/min_tokens fields
    overflow: str | None = None  # a context overflow (failures.context_overflow): the run stops
    stalled: str | None = None  # streams went silent for --stall-timeout, twice running: stop
    stall_streak: int = 0
    notes: list[str] = field(default_factory=list)
    reason_from_driver: bool = False  # a worker was told to stop (it did not find a reason)

    @property
    def stopped(self) -> bool:
        return self.stop_event.is_set()

    def stop_from_driver(self, reason: str) -> None:
        if not self.stopped:
            self.reason_from_driver = True
        self.stop(reason)

    def stop(self, reason: str) -> None:
        if self.stopped:
            return
        self.reason = reason
        self.stop_event.set()
        for task in list(self.tasks):
            task.cancel()
        for callback in list(self.on_stop):
            callback(reason)

    async def observe(self, raw: RawStream) -> None:
        if raw.error_kind != "connection":
            self.conn_streak = 0
            return
        self.conn_streak += 1
        if self.conn_streak < DEAD_SERVER_STREAK or self.checking:
            return
        self.checking = True
        try:
            alive = await self.client.get_text("/v1/models", 3.0, fresh=True) is not None
        finally:
            self.checking = False
        if alive:
            self.conn_streak = 0
        else:
            self.stop(f"server stopped answering ({raw.error})")


#: Stalled requests in a row that end a run (a hiccup is counted; a hang stops it).
STALLS_TO_STOP = 2


def body_for(prompt: Prompt, options: RequestOptions, ignore_eos: bool) -> tuple[bytes, int]:
    """The serialized request for ``prompt`` and its max_tokens."""
    max_t = prompt.max_tokens or options.max_tokens
    body = request_body(
        prompt,
        model=options.model,
        chat=options.chat,
        max_tokens=max_t,
        ignore_eos=options.ignore_eos and ignore_eos,
        temperature=options.temperature,
        logit_bias=options.logit_bias,
    )
    return body, max_t


async def send_one(
    state: LoadState, path: str, body: bytes, max_t: int, prompt: Prompt, index: int, repeat: int
) -> Sent:
    """Send one request and wait for its whole stream (parsing comes later)."""
    state.in_flight += 1
    try:
        raw = await state.client.stream(path, body)
    except asyncio.CancelledError:
        state.cancelled += 1
        raise
    finally:
        state.in_flight -= 1
    if raw.error_kind == "connection" or state.conn_streak:
        await state.observe(raw)
    stall = raw.error_kind == "timeout" and (raw.error or "").startswith("no data for")
    state.stall_streak = state.stall_streak + 1 if stall else 0
    # one stall is a fault counted like any other; two in a row is a server that hangs: every
    # further request would wait as long, so the run ends here with that statement
    if state.stall_streak >= STALLS_TO_STOP and state.stalled is None:
        state.stalled = (
            f"the server stalled: {state.stall_streak} streams in a row sent nothing for "
            f"{state.client.stall_s:g} s (--stall-timeout)"
        )
        state.stop(state.stalled)
    if raw.status == 400 and state.overflow is None:
        overflow = context_overflow(raw.error, prompt.expected_tokens, max_t)
        if overflow is not None:  # every further request would overflow too
            state.overflow = overflow
            state.stop(overflow)
    return Sent(raw, index, repeat, max_t, prompt.expected_tokens)


async def send_session(
    state: LoadState,
    options: RequestOptions,
    first: tuple[bytes, int],
    prompt: Prompt,
    index: int,
    repeat: int,
    sent: list[Sent],
) -> None:
    """A multi-turn session: each turn is sent when the previous answer has come back, with
    the history before it (``workloads.next_turn``). A failed turn ends its session: the next
    one would resend a history the server never produced. Request indexes: ``index`` x turns
    + turn - 1, so every turn of every session has its own."""
    turns = 1 + len(prompt.followups or [])
    body, max_t = first
    current = prompt
    for t in range(turns):
        if t:
            user = (prompt.followups or [])[t - 1]
            last = sent[-1].raw
            if last.status != 200 or last.error_kind is not None or state.stopped:
                return
            current = next_turn(current, last, user, options.chat)
            body, max_t = body_for(current, options, state.ignore_eos)
        one = await send_one(state, options.path, body, max_t, current, index * turns + t, repeat)
        one.turn = t + 1
        sent.append(one)


@dataclass
class DriveOutput:
    """What a share produced: finished requests and when (this host's clock, ns)."""

    sent: list[Sent]
    start_ns: int
    end_ns: int
    used: int = 0  # requests started (prompts used)
    prompts_reused: bool = False


async def _sleep_until(state: LoadState, t_ns: int) -> None:
    delay = (t_ns - time.perf_counter_ns()) / 1e9
    if delay > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.stop_event.wait(), delay)


async def drive(
    share: Share, state: LoadState, on_done: Callable[[], None] | None = None
) -> DriveOutput:
    """Send ``share`` from ``share.start_ns`` on; return when it is done or the run stopped."""
    opts, rep = share.options, share.rep
    prepared = [body_for(p, opts, state.ignore_eos) for p in share.prompts]
    n_prompts = len(prepared)
    sent: list[Sent] = []
    reused = False
    if share.streams:
        # Connections a long-running client would already hold: TCP setup stays out of the
        # loop while other streams' chunks arrive (and out of TTFT).
        await state.client.prewarm(share.streams)
    await _sleep_until(state, share.start_ns)
    start = time.perf_counter_ns()
    # The schedule's origin is the agreed start (workers share it), even if this one is late.
    base = share.start_ns or start
    deadline = base + int(share.duration * 1e9) if share.duration else None

    used = 0

    async def one(k: int) -> None:
        nonlocal reused, used
        used += 1
        j = k % n_prompts
        if k >= n_prompts and not share.reusable:
            reused = True
        index = share.first_index + k * share.index_step
        prompt = share.prompts[j]
        if prompt.followups:
            await send_session(state, opts, prepared[j], prompt, index, rep, sent)
        else:
            body, max_t = prepared[j]
            sent.append(await send_one(state, opts.path, body, max_t, prompt, index, rep))
        if on_done is not None:
            on_done()

    jobs: list[asyncio.Task[Any]] = []
    if share.streams:
        ks = iter(range(share.count)) if share.count is not None else _count()

        async def slot() -> None:
            for k in ks:
                if state.stopped or (deadline and time.perf_counter_ns() >= deadline):
                    return
                await one(k)

        jobs = [asyncio.ensure_future(slot()) for _ in range(share.streams)]
        state.tasks.update(jobs)
    elif share.offsets is not None:
        for k, off in enumerate(share.offsets):
            t_k = base + int(off * 1e9)
            if state.stopped or (deadline and t_k >= deadline):
                break
            await _sleep_until(state, t_k)
            if state.stopped:
                break
            job = asyncio.ensure_future(one(k))
            jobs.append(job)
            state.tasks.add(job)
    await asyncio.gather(*jobs, return_exceptions=True)
    state.tasks.difference_update(jobs)
    return DriveOutput(sent, start, time.perf_counter_ns(), used, reused)
