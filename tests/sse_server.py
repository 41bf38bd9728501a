"""A synthetic OpenAI-compatible SSE server for the bench tests and the fidelity benchmark.

It emits chunks on a schedule we choose (TTFT, ITL, tokens per chunk) and stamps every chunk
with the CLOCK_MONOTONIC time (``t_emit_ns``, ``time.perf_counter_ns`` on Linux, comparable
across processes) taken just before the write, so that a test can measure the client's
timestamp error against what really happened. Plans also inject faults: HTTP errors, stalls,
dropped connections, malformed chunks, error events, and a server that dies mid-run.

A service model for capacity tests: ``slots=K`` serves at most K requests at once and queues
the rest in arrival order (their TTFT includes the wait), so with a request of n tokens taking
S = ttft + (n - 1) x itl the server completes at most K / S requests per second: a known
service rate, as a batched engine's.

Run in a thread (``SSEServer(scenario)`` as a context manager) or as a process:
``python tests/sse_server.py --itl 0.005 --ttft 0.01 [--slots 8]`` prints ``READY <url>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Plan:
    """How the server answers one request."""

    ttft_s: float = 0.005
    itl_s: float = 0.002
    tokens: int | None = None  # None: the request's max_tokens
    tokens_per_chunk: int = 1
    status: int = 200
    reasoning_tokens: int = 0
    usage: bool = True
    usage_tokens_offset: int = 0  # lie in usage (to test mismatch reports)
    prompt_tokens_offset: int = 0  # count the prompt longer/shorter than its words in usage
    token_ids: bool = False
    done: bool = True
    finish_reason: str = "length"
    stall_at: int | None = None  # chunk index before which to stall
    stall_s: float = 0.0
    drop_at: int | None = None  # abort the connection before this chunk
    malformed_at: set[int] = field(default_factory=set)
    error_event_at: int | None = None  # send an error event (and end) before this chunk
    die: bool = False  # the whole server dies when this request arrives
    keepalive_comments: bool = False
    error_message: str | None = None  # message of the error body for status != 200
    event_message: str = "synthetic engine failure"  # message of the error event


Scenario = Callable[[int, dict[str, Any]], Plan]


class _Hist:
    def __init__(self) -> None:
        self.sum = 0.0
        self.count = 0

    def add(self, v: float) -> None:
        self.sum += v
        self.count += 1


class SSEServer:
    """The server, run on its own event loop in a background thread."""

    def __init__(
        self,
        scenario: Scenario | Plan | None = None,
        model: str = "synthetic",
        tokenize: bool = True,
        metrics: bool = True,
        port: int = 0,
        metrics_flaky: bool = False,
        version: str | None = None,
        max_model_len: int | None = None,
        props: dict[str, Any] | None = None,
        slots: int | None = None,
    ) -> None:
        if scenario is None:
            scenario = Plan()
        if isinstance(scenario, Plan):
            plan = scenario
            scenario = lambda _i, _b: plan  # noqa: E731
        self.scenario: Scenario = scenario
        self.model = model
        self.port = port
        self.n_requests = 0
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.hist = {k: _Hist() for k in ("ttft", "itl", "e2e", "queue")}
        self._tokenize = tokenize
        self._metrics = metrics
        self.metrics_flaky = metrics_flaky  # every other /metrics GET (1st, 3rd, ...) gets a 503
        self.metrics_requests = 0
        self.version = version  # GET /version answers {"version": ...} as vLLM's (None: 404)
        self.max_model_len = max_model_len  # in the /v1/models entry, as vLLM's
        self.props = props  # GET /props answers it, as llama-server's (None: 404)
        self.slots = slots  # requests served at once; the rest queue (None: no limit)
        self._slots: asyncio.Semaphore | None = None  # made on the server's loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._transports: set[Any] = set()
        self._ready = threading.Event()
        self.url = ""

    # -- app -------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        if self.version is not None:
            app.router.add_get("/version", self._version)
        if self.props is not None:
            app.router.add_get("/props", self._props)
        if self._tokenize:
            app.router.add_post("/tokenize", self._tokenize_h)
        if self._metrics:
            app.router.add_get("/metrics", self._metrics_h)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        return app

    async def _health(self, _req: web.Request) -> web.Response:
        return web.Response(text="")

    async def _version(self, _req: web.Request) -> web.Response:
        return web.json_response({"version": self.version})

    async def _props(self, _req: web.Request) -> web.Response:
        return web.json_response(self.props)

    async def _models(self, _req: web.Request) -> web.Response:
        entry: dict[str, Any] = {"id": self.model, "object": "model"}
        if self.max_model_len is not None:
            entry["max_model_len"] = self.max_model_len
        return web.json_response({"object": "list", "data": [entry]})

    async def _tokenize_h(self, req: web.Request) -> web.Response:
        body = await req.json()
        n = len(str(body.get("prompt", "")).split())
        return web.json_response({"count": n, "max_model_len": 4096, "tokens": list(range(n))})

    async def _metrics_h(self, _req: web.Request) -> web.Response:
        self.metrics_requests += 1
        if self.metrics_flaky and self.metrics_requests % 2 == 1:
            return web.Response(status=503, text="busy")
        names = {
            "ttft": "vllm:time_to_first_token_seconds",
            "itl": "vllm:inter_token_latency_seconds",
            "e2e": "vllm:e2e_request_latency_seconds",
            "queue": "vllm:request_queue_time_seconds",
        }
        lines = []
        for key, name in names.items():
            h = self.hist[key]
            lab = f'model_name="{self.model}"'
            lines += [
                f"# TYPE {name} histogram",
                f'{name}_bucket{{le="+Inf",{lab}}} {h.count}',
                f"{name}_count{{{lab}}} {h.count}",
                f"{name}_sum{{{lab}}} {h.sum}",
            ]
        return web.Response(text="\n".join(lines) + "\n")

    async def _complete(self, req: web.Request) -> web.StreamResponse:
        t_arrival = time.perf_counter()
        index = self.n_requests
        self.n_requests += 1
        body = await req.json()
        self.bodies.append(body)
        self.headers.append(dict(req.headers))
        plan = self.scenario(index, body)
        if plan.die:
            asyncio.get_running_loop().create_task(self._die())
            await asyncio.sleep(10)
        if plan.status != 200:
            return web.json_response(
                {
                    "object": "error",
                    "message": plan.error_message or f"synthetic {plan.status}",
                    "code": plan.status,
                },
                status=plan.status,
            )
        if self.slots is None:
            return await self._stream(req, body, plan, index, t_arrival, t_arrival)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.slots)
        async with self._slots:  # FIFO: a queued request starts when a slot frees
            return await self._stream(req, body, plan, index, t_arrival, time.perf_counter())

    async def _stream(
        self,
        req: web.Request,
        body: dict[str, Any],
        plan: Plan,
        index: int,
        t_arrival: float,
        t_start: float,
    ) -> web.StreamResponse:
        """Stream the answer on the plan's schedule from ``t_start`` (when a slot took it)."""
        chat = req.path.endswith("/chat/completions")
        n_tokens = plan.tokens if plan.tokens is not None else int(body.get("max_tokens", 16))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        if req.transport is not None:
            self._transports.add(req.transport)
        write = resp.write
        base = {"id": f"cmpl-{index}", "model": self.model, "created": int(time.time())}
        chunks: list[tuple[int, bool]] = []  # (tokens, reasoning)
        left_r, left = plan.reasoning_tokens, n_tokens
        while left_r > 0:
            k = min(plan.tokens_per_chunk, left_r)
            chunks.append((k, True))
            left_r -= k
            left -= k
        while left > 0:
            k = min(plan.tokens_per_chunk, left)
            chunks.append((k, False))
            left -= k
        if chat:
            await write(self._frame(base, chat, {"role": "assistant", "content": ""}, None, None))
        t_first = None
        t_prev = None
        for ci, (k, reasoning) in enumerate(chunks):
            target = t_start + plan.ttft_s + ci * plan.itl_s
            if plan.stall_at == ci:
                target += plan.stall_s
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if plan.drop_at == ci:
                req.transport.abort()  # type: ignore[union-attr]
                return resp
            if plan.error_event_at == ci:
                err = {
                    "error": {
                        "object": "error",
                        "message": plan.event_message,
                        "type": "InternalServerError",
                        "code": 500,
                    }
                }
                await write(b"data: " + json.dumps(err).encode() + b"\n\n")
                await write(b"data: [DONE]\n\n")
                return resp
            if ci in plan.malformed_at:
                await write(b"data: {not json\n\n")
                continue
            if plan.keepalive_comments:
                await write(b": keep-alive\n\n")
            text = " tok" * k  # a token's text carries its leading space, as BPE vocabularies'
            ids = list(range(k)) if plan.token_ids else None
            finish = plan.finish_reason if ci == len(chunks) - 1 else None
            delta = {"reasoning_content": text} if reasoning else {"content": text}
            frame = self._frame(base, chat, delta, finish, ids, text_only=text)
            now = time.perf_counter()
            if t_first is None:
                t_first = now
                self.hist["ttft"].add(now - t_arrival)
            else:
                for _ in range(k):
                    self.hist["itl"].add((now - t_prev) / k)  # type: ignore[operator]
            t_prev = now
            await write(
                frame.replace(b'"t_emit_ns": 0', b'"t_emit_ns": %d' % time.perf_counter_ns())
            )
        self.hist["e2e"].add(time.perf_counter() - t_arrival)
        self.hist["queue"].add(t_start - t_arrival)
        if plan.usage:
            usage = {
                "prompt_tokens": (self._prompt_words(body) or 1) + plan.prompt_tokens_offset,
                "completion_tokens": n_tokens + plan.usage_tokens_offset,
                "total_tokens": n_tokens + 1,
            }
            await write(
                b"data: " + json.dumps({**base, "choices": [], "usage": usage}).encode() + b"\n\n"
            )
        if plan.done:
            await write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    @staticmethod
    def _prompt_words(body: dict[str, Any]) -> int:
        """The server's "tokenizer": one token per whitespace-separated word, of the prompt or
        of every message's content (no chat template: the count is the words sent)."""
        if isinstance(body.get("messages"), list):
            return sum(len(str(m.get("content", "")).split()) for m in body["messages"])
        return len(str(body.get("prompt", "")).split())

    @staticmethod
    def _frame(
        base: dict[str, Any],
        chat: bool,
        delta: dict[str, Any],
        finish: str | None,
        ids: list[int] | None,
        text_only: str | None = None,
    ) -> bytes:
        if chat:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {
                "index": 0,
                "text": text_only if text_only is not None else "",
                "finish_reason": finish,
            }
            obj = "text_completion"
        if ids is not None:
            choice["token_ids"] = ids
        payload = {**base, "object": obj, "choices": [choice], "t_emit_ns": 0}
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    async def _die(self) -> None:
        if self._site is not None:
            await self._site.stop()
        for tr in list(self._transports):
            tr.abort()

    # -- lifecycle -------------------------------------------------------------------------
    async def _start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await self._site.start()
        port = self._site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> SSEServer:
        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._start())
            self._ready.set()
            loop.run_forever()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            for tr in list(self._transports):
                self._loop.call_soon_threadsafe(tr.abort)
            if self._runner is not None:
                fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
                with contextlib.suppress(Exception):
                    fut.result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> SSEServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """Serve until killed; print ``READY <url>`` once listening."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft", type=float, default=0.005)
    ap.add_argument("--itl", type=float, default=0.002)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--slots", type=int, default=None, help="requests served at once")
    ap.add_argument("--uvloop", action="store_true")
    args = ap.parse_args(argv)
    defaults = {"ttft_s": args.ttft, "itl_s": args.itl, "tokens_per_chunk": args.tokens_per_chunk}

    def scenario(_i: int, body: dict[str, Any]) -> Plan:
        # A request may override the plan with an "x_plan" object (used by the fidelity bench).
        extra = body.get("x_plan") if isinstance(body.get("x_plan"), dict) else {}
        return Plan(**{**defaults, **extra})

    server = SSEServer(scenario, port=args.port, slots=args.slots)

    async def serve() -> None:
        await server._start()
        print(f"READY {server.url}", flush=True)
        await asyncio.Event().wait()

    if args.uvloop:
        import uvloop

        uvloop.run(serve())
    else:
        asyncio.run(serve())


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main(sys.argv[1:])
