"""HTTP side of the benchmark: one shared aiohttp pool, preflight, tokenizer, streaming request.

Timing rule: ``time.perf_counter_ns()`` (CLOCK_MONOTONIC on Linux, comparable across
processes) is read in the connection protocol's ``data_received``, the moment the event loop
hands over the socket's bytes, before any HTTP or SSE parsing; each SSE event gets the time of
the read that completed it. (Where aiohttp's internals do not allow that, the time the reading
task wakes up is used: ``timestamp_source`` says which.) The request body is serialized before
the send timestamp. Everything after the stream ends (JSON parsing,
token counting) lives in :mod:`ceiling.bench.metrics`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from typing import Any

import aiohttp

from ceiling.bench.sse import SSESplitter
from ceiling.errors import EXIT_SERVER, CeilingError
from ceiling.redact import API_KEY_ENV, redact

__all__ = ["API_KEY_ENV", "Client", "RawStream", "api_key", "base_url", "redact"]

#: Connecting (and the preflight) must fail fast: a wrong URL is an error in seconds, not minutes.
CONNECT_TIMEOUT_S = 4.0

try:  # aiohttp's connection protocol: subclassed to timestamp bytes as the socket delivers them
    from aiohttp.client_proto import ResponseHandler as _ResponseHandler
except ImportError:  # pragma: no cover - a future aiohttp; we fall back to read-time stamps
    _ResponseHandler = None  # type: ignore[assignment,misc]


if _ResponseHandler is not None:

    class TimedResponseHandler(_ResponseHandler):  # type: ignore[misc,valid-type]
        """aiohttp's protocol, plus an arrival log: (time, payload bytes so far) per socket read.

        ``data_received`` is the earliest point Python sees the bytes; the reading task wakes
        up later (one loop iteration, or many when a burst of streams arrives together). The log
        lets the reader give each SSE event the time of the socket read that completed it.
        """

        timing_payload: Any = None
        timing_log: list[tuple[int, int]] | None = None

        def data_received(self, data: bytes) -> None:
            t = time.perf_counter_ns()
            super().data_received(data)
            log = self.timing_log
            if log is not None:
                log.append((t, self.timing_payload.total_bytes))


def _connector() -> tuple[aiohttp.TCPConnector, str]:
    """The shared pool, with socket-time stamps when this aiohttp allows ("socket"), else
    stamps taken when the reading task wakes up ("reader")."""
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    if _ResponseHandler is not None and hasattr(connector, "_factory"):
        loop = asyncio.get_running_loop()
        connector._factory = functools.partial(TimedResponseHandler, loop=loop)
        return connector, "socket"
    return connector, "reader"


def api_key() -> str | None:
    """The API key from the environment (``CEILING_API_KEY``, ``OPENAI_API_KEY``), or None."""
    from ceiling.redact import env_api_key

    return env_api_key()


def base_url(url: str) -> str:
    """Normalize a server URL to its root (``http://h:p``), accepting a trailing ``/v1``."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


class RawStream:
    """What one request produced on the wire: timestamps and raw payloads, nothing parsed.

    ``events`` holds ``(arrival ns, payload)``; arrival is the socket read that completed the
    event (see :class:`TimedResponseHandler`).
    """

    __slots__ = (
        "error",
        "error_kind",
        "events",
        "leftover",
        "status",
        "t_end_ns",
        "t_first_byte_ns",
        "t_send_ns",
    )

    def __init__(self) -> None:
        self.t_send_ns = 0
        self.t_first_byte_ns = 0
        self.t_end_ns = 0
        self.status = 0
        self.events: list[tuple[int, bytes]] = []
        self.error_kind: str | None = None
        self.error: str | None = None
        self.leftover = b""


class Client:
    """A shared connection pool and the server's OpenAI-compatible endpoints."""

    def __init__(self, url: str, *, timeout_s: float, stall_s: float | None = None) -> None:
        self.base = base_url(url)
        self.timeout_s = timeout_s
        self.stall_s = stall_s if stall_s is not None else timeout_s
        headers = {"Accept": "text/event-stream"}
        key = api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._headers = headers
        self._session: aiohttp.ClientSession | None = None
        self.timestamp_source = "reader"

    async def __aenter__(self) -> Client:
        connector, self.timestamp_source = _connector()
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(
                total=self.timeout_s, connect=CONNECT_TIMEOUT_S, sock_read=self.stall_s
            ),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use Client as an async context manager"
        return self._session

    async def _get_json(self, path: str, timeout_s: float = 5.0) -> tuple[int, Any]:
        tmo = aiohttp.ClientTimeout(total=timeout_s, connect=CONNECT_TIMEOUT_S)
        async with self.session.get(self.base + path, timeout=tmo) as resp:
            try:
                body = await resp.json(content_type=None)
            except (json.JSONDecodeError, aiohttp.ContentTypeError, UnicodeDecodeError):
                body = None
            return resp.status, body

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
                exit_code=EXIT_SERVER,
            ) from err
        except aiohttp.ClientError as err:
            raise CeilingError(
                f"cannot reach {self.base}: {redact(str(err)) or type(err).__name__}",
                fix="check the host and port, and that the server is running",
                exit_code=EXIT_SERVER,
            ) from err
        if status in (401, 403):
            raise CeilingError(
                f"{url} refused the request (HTTP {status})",
                fix="set CEILING_API_KEY (or OPENAI_API_KEY) to the server's API key",
                exit_code=EXIT_SERVER,
            )
        if status == 404:
            raise CeilingError(
                f"{url} does not exist (HTTP 404): not an OpenAI-compatible API root",
                fix="pass the server root, e.g. --url http://127.0.0.1:8000",
                exit_code=EXIT_SERVER,
            )
        if status != 200:
            if model:
                return model
            raise CeilingError(
                f"{url} answered HTTP {status}",
                fix="pass --model explicitly, or check the server",
                exit_code=EXIT_SERVER,
            )
        data = body.get("data") if isinstance(body, dict) else None
        ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        if model:
            return model
        if not ids or not isinstance(ids[0], str):
            raise CeilingError(
                f"{url} lists no model", fix="pass --model explicitly", exit_code=EXIT_SERVER
            )
        return str(ids[0])

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
            tmo = aiohttp.ClientTimeout(total=10, connect=CONNECT_TIMEOUT_S)
            async with self.session.post(
                self.base + "/tokenize", json=payload, timeout=tmo
            ) as resp:
                if resp.status != 200:
                    return None
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError):
            return None
        if isinstance(body, dict):
            if isinstance(body.get("count"), int):
                return int(body["count"])
            if isinstance(body.get("tokens"), list):
                return len(body["tokens"])
        return None

    async def get_text(self, path: str, timeout_s: float = 5.0) -> str | None:
        """GET a text resource (``/metrics``); None when absent or unreachable."""
        try:
            tmo = aiohttp.ClientTimeout(total=timeout_s, connect=CONNECT_TIMEOUT_S)
            async with self.session.get(self.base + path, timeout=tmo) as resp:
                if resp.status != 200:
                    return None
                return await resp.text()
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return None

    async def stream(self, path: str, body: bytes) -> RawStream:
        """POST a streaming request and record arrival times of every SSE event.

        Never raises for server-side failures: they land in ``error_kind`` (``http_4xx``,
        ``http_5xx``, ``timeout``, ``connection``) so that the run goes on. A request that
        failed to be WRITTEN (no status, no byte back) is sent once more: the pooled keep-alive
        connection was closed by the server (llama-server closes it after each stream).
        """
        raw = await self._stream_once(path, body)
        if raw.error_kind == "connection" and not raw.status and not raw.t_first_byte_ns:
            raw = await self._stream_once(path, body)
        return raw

    async def _stream_once(self, path: str, body: bytes) -> RawStream:
        raw = RawStream()
        splitter = SSESplitter()
        events = raw.events
        perf = time.perf_counter_ns
        raw.t_send_ns = perf()
        try:
            async with self.session.post(
                self.base + path, data=body, headers={"Content-Type": "application/json"}
            ) as resp:
                raw.status = resp.status
                if resp.status != 200:
                    raw.t_first_byte_ns = perf()
                    text = (await resp.text(errors="replace"))[:500]
                    raw.error_kind = "http_4xx" if 400 <= resp.status < 500 else "http_5xx"
                    raw.error = redact(f"HTTP {resp.status}: {text.strip()}")
                    return raw
                content = resp.content
                conn = resp.connection
                proto = conn.protocol if conn is not None else None
                log: list[tuple[int, int]] | None = None
                if _ResponseHandler is not None and isinstance(proto, TimedResponseHandler):
                    log = []
                    proto.timing_payload, proto.timing_log = content, log
                # Bytes already buffered before the log was attached get the read time.
                attached = content.total_bytes
                li = 0
                try:
                    while True:
                        data = await content.readany()
                        t_read = perf()
                        if not data:
                            break
                        if not raw.t_first_byte_ns:
                            raw.t_first_byte_ns = log[0][0] if log and not attached else t_read
                        for payload, end in splitter.feed(data):
                            t = t_read
                            if log and end > attached:
                                while li < len(log) and log[li][1] < end:
                                    li += 1
                                if li < len(log):
                                    t = log[li][0]
                            events.append((t, payload))
                finally:
                    if log is not None:
                        proto.timing_payload, proto.timing_log = None, None  # type: ignore[union-attr]
        except TimeoutError:
            raw.error_kind = "timeout"
            raw.error = f"no data for {self.stall_s:g} s or over {self.timeout_s:g} s in total"
        except (aiohttp.ClientError, OSError) as err:
            raw.error_kind = "connection"
            raw.error = redact(f"{type(err).__name__}: {err}")[:300]
        finally:
            raw.t_end_ns = perf()
            raw.leftover = splitter.leftover()
        return raw
