"""HTTP side of the benchmark: preflight, tokenizer, and the streaming request.

Timing rule: every socket read of a stream is stamped on the ``time.perf_counter_ns()`` clock
(CLOCK_MONOTONIC on Linux: one clock for every process on the host), with the kernel's receive
time on plain TCP on Linux, else when the event loop hands the bytes over, before any HTTP or
SSE parsing (:mod:`ceiling.bench.http`, :mod:`ceiling.bench.kstamp`); each SSE event gets the
stamp of the read that completed it. The request body is serialized before the send timestamp.
Everything after the stream ends (SSE splitting, JSON parsing, token counting) happens later:
the splitting when ``RawStream.events`` is first read, the rest in :mod:`ceiling.bench.metrics`.
``/v1/models``, ``/tokenize`` and ``/metrics`` go through aiohttp (:mod:`ceiling.server.aio`);
URL, credentials and proxy of both are :mod:`ceiling.server.policy`'s.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from ceiling.bench.http import HTTPError, Sink, StreamProtocol
from ceiling.bench.pool import StreamPool

# RawStream and base_url are pure (bytes and strings, no socket): they live in bench.stream and
# ceiling.inputs so the result nouns (bench.metrics, bench.config, trace.capture) use them
# without importing this HTTP client (tests/test_import_contract.py: the purity closure).
# Re-exported here: the client's callers keep their import.
from ceiling.bench.stream import RawStream
from ceiling.engines import all_engines
from ceiling.errors import CeilingError, ExitStatus
from ceiling.inputs import base_url
from ceiling.redact import API_KEY_ENV, env_api_key, redact
from ceiling.server.aio import AsyncClient
from ceiling.server.policy import CONNECT_TIMEOUT_S, target

__all__ = [
    "API_KEY_ENV",
    "CONNECT_TIMEOUT_S",
    "Client",
    "RawStream",
    "api_key",
    "base_url",
    "redact",
]

#: Error text kept from a non-200 answer.
ERROR_TEXT = 500


def api_key() -> str | None:
    """The API key from the environment (``CEILING_API_KEY``, ``OPENAI_API_KEY``), or None."""
    return env_api_key()


class Client:
    """A shared connection pool and the server's OpenAI-compatible endpoints.

    URL, credentials and proxy are :func:`ceiling.server.policy.target`'s, for the timed
    streams (:class:`StreamPool`) and the other calls (:class:`AsyncClient`) alike.
    """

    def __init__(self, url: str, *, timeout_s: float, stall_s: float | None = None) -> None:
        self.target = target(url)
        #: The URL as given (normalized): what results record, redacted (``runner``); requests
        #: go to ``target.base``, without the credentials.
        self.base = base_url(url)
        self.timeout_s = timeout_s
        self.stall_s = stall_s if stall_s is not None else timeout_s
        self._headers = {"Accept": "text/event-stream"}
        self._api: AsyncClient | None = None
        self._pool: StreamPool | None = None
        #: Where chunk stamps come from: "kernel" (the kernel's receive time of each read,
        #: plain TCP on Linux) or "socket" (when the event loop hands the read over).
        self.timestamp_source = "kernel"

    async def __aenter__(self) -> Client:
        tmo = aiohttp.ClientTimeout(
            total=self.timeout_s, connect=CONNECT_TIMEOUT_S, sock_read=self.stall_s
        )
        self._api = await AsyncClient(self.target, self._headers, tmo).__aenter__()
        self._pool = StreamPool(self.target, self._headers, CONNECT_TIMEOUT_S)
        self.timestamp_source = self._pool.timestamp_source
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._api is not None:
            await self._api.__aexit__()
            self._api = None

    @property
    def timestamp_fallbacks(self) -> int:
        """Reads that should have had a kernel stamp and got the read time instead."""
        return self._pool.kernel_misses[0] if self._pool is not None else 0

    @property
    def api(self) -> AsyncClient:
        assert self._api is not None, "use Client as an async context manager"
        return self._api

    @property
    def session(self) -> aiohttp.ClientSession:
        return self.api.session

    async def _get_json(self, path: str, timeout_s: float = 5.0) -> tuple[int, Any]:
        return await self.api.get_json(path, timeout_s)

    async def detect_model(self, model: str | None) -> str:
        """Check the server answers and return the model id (the first one served, or ``model``).

        Raises CeilingError within ~5 s for an unreachable server or a URL that is not an
        OpenAI-compatible API root.
        """
        url = self.base + "/v1/models"
        try:
            status, body = await self._get_json("/v1/models")
        except TimeoutError as err:
            raise CeilingError(
                f"no answer from {self.base} within 5 s",
                fix="check the URL and that the server has finished loading (GET /health)",
                exit_code=ExitStatus.SERVER,
            ) from err
        except aiohttp.ClientError as err:
            raise CeilingError(
                f"cannot reach {self.base}: {redact(str(err)) or type(err).__name__}",
                fix="check the host and port, and that the server is running",
                exit_code=ExitStatus.SERVER,
            ) from err
        if status in (401, 403):
            raise CeilingError(
                f"{url} refused the request (HTTP {status})",
                fix="set CEILING_API_KEY (or OPENAI_API_KEY) to the server's API key",
                exit_code=ExitStatus.SERVER,
            )
        if status == 404:
            raise CeilingError(
                f"{url} does not exist (HTTP 404): not an OpenAI-compatible API root",
                fix="pass the server root, e.g. --url http://127.0.0.1:8000",
                exit_code=ExitStatus.SERVER,
            )
        if status != 200:
            if model:
                return model
            raise CeilingError(
                f"{url} answered HTTP {status}",
                fix="pass --model explicitly, or check the server",
                exit_code=ExitStatus.SERVER,
            )
        data = body.get("data") if isinstance(body, dict) else None
        ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        if model:
            return model
        if not ids or not isinstance(ids[0], str):
            raise CeilingError(
                f"{url} lists no model", fix="pass --model explicitly", exit_code=ExitStatus.SERVER
            )
        return str(ids[0])

    async def served_context(self, model: str) -> tuple[int | None, str | None]:
        """(tokens of context one request gets, where the server said it); (None, None) when
        it does not say. vLLM's ``/v1/models`` carries ``max_model_len``; an engine with its
        own endpoint (llama-server's ``/props``) names it in its adapter."""
        try:
            status, body = await self._get_json("/v1/models")
        except (aiohttp.ClientError, TimeoutError):
            status, body = 0, None
        data = body.get("data") if status == 200 and isinstance(body, dict) else None
        for entry in data if isinstance(data, list) else []:
            if isinstance(entry, dict) and entry.get("id") == model:
                n = entry.get("max_model_len")
                if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                    return n, "/v1/models max_model_len"
        for engine in all_engines():
            if engine.context_path is None:
                continue
            try:
                status, body = await self._get_json(engine.context_path)
            except (aiohttp.ClientError, TimeoutError):
                continue
            n = engine.served_context_from(body) if status == 200 else None
            if n is not None:
                return n, f"{engine.context_path} ({engine.display_name})"
        return None, None

    async def tokenize(self, model: str, text: str) -> int | None:
        """Token count of ``text`` from the server's ``/tokenize``, or None. vLLM and SGLang
        read ``prompt``; llama-server reads ``content`` (and answers ``{"tokens": []}`` to a
        body without it), so an empty answer is asked again in its form."""
        for body in (
            {"model": model, "prompt": text, "add_special_tokens": False},
            {"content": text, "add_special": False},
        ):
            n = await self._tokenize(body)
            if n:
                return n
        return None

    async def _tokenize(self, payload: dict[str, Any]) -> int | None:
        try:
            status, body = await self.api.post_json("/tokenize", payload, timeout_s=10)
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError):
            return None
        if status != 200:
            return None
        if isinstance(body, dict):
            if isinstance(body.get("count"), int):
                return int(body["count"])
            if isinstance(body.get("tokens"), list):
                return len(body["tokens"])
        return None

    async def get_text(self, path: str, timeout_s: float = 5.0, fresh: bool = False) -> str | None:
        """GET a text resource (``/metrics``); None when absent or unreachable (asked again
        once on a new connection: :meth:`AsyncClient.get_text` says why)."""
        return await self.api.get_text(path, timeout_s, fresh)

    async def stream(self, path: str, body: bytes) -> RawStream:
        """POST a streaming request and record the arrival time of every socket read.

        Never raises for server-side failures: they land in ``error_kind`` (``http_4xx``,
        ``http_5xx``, ``timeout``, ``connection``) so that the run goes on. A reused keep-alive
        connection that the server closed before answering (llama-server closes it after each
        stream) is retried once on a fresh one (the send time stays the first attempt's).
        """
        assert self._pool is not None, "use Client as an async context manager"
        pool = self._pool
        raw = RawStream()
        request = pool.request_bytes(path, body, "application/json")
        raw.t_send_ns = time.perf_counter_ns()
        deadline_ns = raw.t_send_ns + int(self.timeout_s * 1e9)
        sink = Sink()
        proto: StreamProtocol | None = None
        try:
            for attempt in (0, 1):
                proto, reused = await pool.acquire()
                sink = Sink()
                try:
                    await self._response(proto, sink, request, deadline_ns)
                except HTTPError:
                    if reused and attempt == 0 and not sink.t_first_byte_ns:
                        pool.release(proto)  # not reusable: dropped
                        proto = None
                        continue
                    raise
                break
        except TimeoutError as err:
            raw.error_kind = "timeout"
            raw.error = str(err) or f"no answer within {CONNECT_TIMEOUT_S:g} s"
        except (HTTPError, OSError) as err:
            raw.error_kind = "connection"
            raw.error = redact(f"{type(err).__name__}: {err}")[:300]
        finally:
            raw.t_end_ns = time.perf_counter_ns()
            if proto is not None:
                pool.release(proto)  # closes it unless the response ended cleanly
        raw.status = sink.status
        raw.t_first_byte_ns = sink.t_first_byte_ns
        if sink.status == 200 or not sink.status:
            raw.reads, raw.ends, raw.parts = sink.reads, sink.ends, sink.parts
        elif raw.error_kind is None:
            text = b"".join(sink.parts)[:ERROR_TEXT].decode("utf-8", "replace").strip()
            raw.error_kind = "http_4xx" if 400 <= sink.status < 500 else "http_5xx"
            raw.error = redact(f"HTTP {sink.status}: {text}")
        return raw

    async def _response(
        self, proto: StreamProtocol, sink: Sink, request: bytes, deadline_ns: int
    ) -> None:
        """Send on ``proto`` and wait for the whole response; a stall (no byte for
        ``stall_s``) or the total deadline fails it with TimeoutError."""
        loop = asyncio.get_running_loop()
        stall_ns = int(self.stall_s * 1e9)
        fut = proto.start(sink, request)
        proto.last_read_ns = time.perf_counter_ns()
        handle: asyncio.TimerHandle | None = None

        def check() -> None:
            # One timer per stall period, not one per read: reads only update last_read_ns.
            nonlocal handle
            now = time.perf_counter_ns()
            idle = now - proto.last_read_ns
            if now >= deadline_ns:
                proto.fail(TimeoutError(f"over {self.timeout_s:g} s in total"))
            elif idle >= stall_ns:
                proto.fail(TimeoutError(f"no data for {self.stall_s:g} s"))
            else:
                wait = min(stall_ns - idle, deadline_ns - now)
                handle = loop.call_later(wait / 1e9, check)

        handle = loop.call_later(min(stall_ns, deadline_ns - proto.last_read_ns) / 1e9, check)
        try:
            await fut
        finally:
            handle.cancel()

    async def prewarm(self, n: int) -> None:
        """Open connections until ``n`` idle ones wait in the pool (failures are left to the
        requests that would use them)."""
        assert self._pool is not None, "use Client as an async context manager"
        await self._pool.prewarm(n)
