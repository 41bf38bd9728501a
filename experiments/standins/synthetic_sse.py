"""A lean synthetic OpenAI streaming server that logs when it really sent every chunk.

The truth for client-accuracy benchmarks (``client_vs_vllm.py``, ``ingest_rate.py``): each
request streams ``max_tokens`` chunks, the first ``--ttft`` after the request arrived and then
one every ``--itl`` (on the request's own schedule, or with ``--sync`` on a global grid, as one
batched decode step fanned out to every stream). Just before each write the server reads
CLOCK_MONOTONIC (``time.perf_counter_ns``, the clock every client on this host stamps with), so
per request it knows its real first and last emission: true TPOT = (last - first) / (n - 1).

It is a bare asyncio protocol (uvloop when installed) with HTTP/1.1 keep-alive and chunked
transfer encoding, as uvicorn sends vLLM's streams, because an aiohttp-web server costs 5-10x
more CPU per chunk and cannot offer 100k chunks/s. ``--procs K`` runs K processes on one port
(SO_REUSEPORT) for machines with spare cores. Endpoints: ``GET /v1/models``, ``GET /health``,
``POST /tokenize`` (one token per word), ``POST /v1/completions``, ``POST /v1/chat/completions``.

Library use (what the benchmarks do)::

    with SyntheticServer(ttft=0.05, itl=0.01, procs=1) as srv:
        ...  # run a client against srv.url
        log = srv.collect()  # per-request truth since the last collect(), then reset

Standalone: ``python experiments/standins/synthetic_sse.py --itl 0.01`` prints ``READY <url>`` and serves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing as mp
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

_perf_ns = time.perf_counter_ns
_STAMP_HOLE = 10**18  # 19 digits, replaced by the emission time


@dataclass
class Truth:
    """What the server really did for one streamed request (ns, CLOCK_MONOTONIC)."""

    arrival_ns: int
    first_ns: int = 0
    last_ns: int = 0
    n: int = 0
    late_max_ns: int = 0  # worst emission behind the request's schedule
    close_gaps: int = 0  # gaps under 1 ms between two chunks as sent (the server was late)

    @property
    def tpot_ms(self) -> float | None:
        return (self.last_ns - self.first_ns) / 1e6 / (self.n - 1) if self.n > 1 else None


@dataclass
class _Config:
    ttft: float
    itl: float
    sync: bool
    stamp: bool = False  # put each chunk's emission time in it ("t_emit_ns", 19 digits)
    model: str = "synthetic"
    log: list[Truth] = field(default_factory=list)


class _Stream:
    """One streamed response on a connection: its chunk schedule, driven by loop timers."""

    __slots__ = (
        "chunk",
        "conn",
        "hole",
        "k",
        "last_chunk",
        "loop",
        "n",
        "t0",
        "t0_ns",
        "tail",
        "truth",
    )

    def __init__(self, conn: _Conn, n: int, chat: bool, rid: str, truth: Truth) -> None:
        cfg = conn.cfg
        self.conn, self.n, self.truth, self.k = conn, n, truth, 0
        self.loop = asyncio.get_running_loop()
        now = self.loop.time()
        first = now + cfg.ttft
        if cfg.sync:  # on the global grid: every stream emits at the same instants
            first = math.ceil(first / cfg.itl) * cfg.itl
        self.t0 = first
        self.t0_ns = _perf_ns() + int((first - now) * 1e9)  # the schedule on the stamp clock
        created = int(time.time())
        st = {"t_emit_ns": _STAMP_HOLE} if cfg.stamp else {}
        if chat:
            head = {"id": rid, "object": "chat.completion.chunk", "created": created}
            body = {**head, "model": cfg.model}

            def frame(finish: str | None) -> bytes:
                ch = {"index": 0, "delta": {"content": "tok "}, "finish_reason": finish}
                return _chunk(
                    b"data: " + json.dumps({**body, **st, "choices": [ch]}).encode() + b"\n\n"
                )
        else:
            body = {"id": rid, "object": "text_completion", "created": created, "model": cfg.model}

            def frame(finish: str | None) -> bytes:
                ch = {"index": 0, "text": "tok ", "logprobs": None, "finish_reason": finish}
                return _chunk(
                    b"data: " + json.dumps({**body, **st, "choices": [ch]}).encode() + b"\n\n"
                )

        self.chunk, self.last_chunk = frame(None), frame("length")
        self.hole = self.chunk.find(b"%d" % _STAMP_HOLE) if cfg.stamp else -1
        usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
        self.tail = (
            _chunk(
                b"data: " + json.dumps({**body, "choices": [], "usage": usage}).encode() + b"\n\n"
            )
            + _chunk(b"data: [DONE]\n\n")
            + b"0\r\n\r\n"
        )
        self.loop.call_at(self.t0, self._tick)

    def _tick(self) -> None:
        tr = self.conn.transport
        if tr is None or tr.is_closing():
            return
        k = self.k
        last = k == self.n - 1
        data = self.last_chunk if last else self.chunk
        t = _perf_ns()
        if self.hole >= 0:
            h = self.hole
            data = b"%s%19d%s" % (data[:h], t, data[h + 19 :])  # space-padded: valid JSON
        tr.write(data)
        tru = self.truth
        if k == 0:
            tru.first_ns = t
        elif t - tru.last_ns < 1_000_000:
            tru.close_gaps += 1
        tru.last_ns = t
        tru.n = k + 1
        late = t - self.t0_ns - int(k * self.conn.cfg.itl * 1e9)
        if late > tru.late_max_ns:
            tru.late_max_ns = late
        if last:
            tr.write(self.tail)
            self.conn.stream_done()
            return
        self.k = k + 1
        self.loop.call_at(self.t0 + self.k * self.conn.cfg.itl, self._tick)


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _response(status: str, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return (
        b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
        % (status.encode(), ctype, len(body))
        + body
    )


class _Conn(asyncio.Protocol):
    """HTTP/1.1 keep-alive connection: requests one after another, streams as chunked SSE."""

    def __init__(self, cfg: _Config) -> None:
        self.cfg = cfg
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        with contextlib.suppress(OSError, AttributeError):
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def stream_done(self) -> None:
        self.busy = False
        self._next()

    def _next(self) -> None:
        while not self.busy and self.transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            method, path = head[0].split(" ")[:2]
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            self._handle(method, path, body)

    def _handle(self, method: str, path: str, body: bytes) -> None:
        tr = self.transport
        assert tr is not None
        cfg = self.cfg
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            arrival = _perf_ns()
            req = json.loads(body)
            n = int(req.get("max_tokens") or 16)
            truth = Truth(arrival)
            cfg.log.append(truth)
            tr.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            self.busy = True
            _Stream(self, n, path.endswith("chat/completions"), f"cmpl-{len(cfg.log)}", truth)
        elif path == "/v1/models":
            data = {"object": "list", "data": [{"id": cfg.model, "object": "model"}]}
            tr.write(_response("200 OK", json.dumps(data).encode()))
        elif path == "/health":
            tr.write(_response("200 OK", b""))
        elif path == "/tokenize" and method == "POST":
            req = json.loads(body)
            count = len(str(req.get("prompt", "")).split())
            tr.write(_response("200 OK", json.dumps({"count": count}).encode()))
        else:
            tr.write(_response("404 Not Found", b'{"detail":"Not Found"}'))


def _serve(sock: socket.socket, cfg: _Config, ctl: Connection) -> None:
    """One server process: serve on ``sock``; answer ``collect`` on the control pipe."""
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Conn(cfg), sock=sock, backlog=8192)
        done = loop.create_future()

        def on_ctl() -> None:
            try:
                cmd = ctl.recv()
            except EOFError:
                cmd = "stop"
            if cmd == "collect":
                log, cfg.log[:] = list(cfg.log), []
                ctl.send([t.__dict__ for t in log])
            elif not done.done():
                done.set_result(None)

        loop.add_reader(ctl.fileno(), on_ctl)
        ctl.send("ready")
        await done
        server.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


class SyntheticServer:
    """``procs`` server processes on one port; ``collect()`` gathers their truth logs."""

    def __init__(
        self,
        ttft: float = 0.05,
        itl: float = 0.01,
        procs: int = 1,
        sync: bool = False,
        stamp: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.cfg = _Config(ttft, itl, sync, stamp)
        self.procs, self.host, self.port = procs, host, port
        self._children: list[tuple[mp.process.BaseProcess, Connection]] = []
        self.url = ""

    def start(self) -> SyntheticServer:
        ctx = mp.get_context("spawn")
        port = self.port
        for _ in range(self.procs):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.procs > 1:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((self.host, port))
            port = sock.getsockname()[1]
            sock.listen(8192)
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(sock, self.cfg, child), daemon=True)
            proc.start()
            sock.close()
            if not parent.poll(60) or parent.recv() != "ready":
                self.stop()
                raise RuntimeError("synthetic server did not start")
            self._children.append((proc, parent))
        self.url = f"http://{self.host}:{port}"
        return self

    def collect(self) -> list[Truth]:
        """Every streamed request since the last collect (all processes), then forget them."""
        out: list[Truth] = []
        for _proc, conn in self._children:
            conn.send("collect")
            out += [Truth(**d) for d in conn.recv()]
        return sorted(out, key=lambda t: t.arrival_ns)

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the server processes have used so far."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for proc, _conn in self._children:
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{proc.pid}/stat").read_text()
                fields = stat.rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
        return total

    def stop(self) -> None:
        for proc, conn in self._children:
            with contextlib.suppress(OSError, BrokenPipeError):
                conn.send("stop")
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        self._children = []

    def __enter__(self) -> SyntheticServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def truth_summary(log: list[Truth], skip_first: int = 0) -> dict[str, Any]:
    """Mean/median true TPOT and TTFT of the logged requests (``skip_first``: warm-ups)."""
    import numpy as np

    reqs = [t for t in log[skip_first:] if t.n > 1]
    tpots = np.asarray([t.tpot_ms for t in reqs], dtype=float)
    chunks = sum(t.n for t in reqs)
    span = (max(t.last_ns for t in reqs) - min(t.first_ns for t in reqs)) / 1e9 if reqs else 0
    return {
        "requests": len(reqs),
        "mean_tpot_ms": float(tpots.mean()) if len(reqs) else None,
        "median_tpot_ms": float(np.median(tpots)) if len(reqs) else None,
        "mean_ttft_ms": float(np.mean([(t.first_ns - t.arrival_ns) / 1e6 for t in reqs]))
        if reqs
        else None,
        "chunks": chunks,
        "chunk_rate_per_s": chunks / span if span else None,
        "late_max_ms": max((t.late_max_ns for t in reqs), default=0) / 1e6,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ttft", type=float, default=0.05)
    ap.add_argument("--itl", type=float, default=0.01)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--sync", action="store_true")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    with SyntheticServer(args.ttft, args.itl, args.procs, args.sync, port=args.port) as srv:
        print(f"READY {srv.url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main(sys.argv[1:])
