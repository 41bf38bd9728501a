"""HTTP side of the benchmark: one shared aiohttp pool, preflight, tokenizer, streaming request.

Timing rule: ``time.perf_counter_ns()`` (CLOCK_MONOTONIC on Linux, comparable across
processes) is read immediately after each socket read returns, before any parsing. The request
body is serialized before the send timestamp. Everything after the stream ends (JSON parsing,
token counting) lives in :mod:`ceiling.bench.metrics`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import aiohttp

from ceiling.bench.sse import SSESplitter
from ceiling.errors import CeilingError

#: Environment variables read for the API key, in order. The key is sent as a header only.
API_KEY_ENV = ("CEILING_API_KEY", "OPENAI_API_KEY")
#: Connecting (and the preflight) must fail fast: a wrong URL is an error in seconds, not minutes.
CONNECT_TIMEOUT_S = 4.0


def api_key() -> str | None:
    """The API key from the environment, or None."""
    for name in API_KEY_ENV:
        val = os.environ.get(name)
        if val:
            return val
    return None


def base_url(url: str) -> str:
    """Normalize a server URL to its root (``http://h:p``), accepting a trailing ``/v1``."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def redact(text: str) -> str:
    """Remove the API key from any text that may reach a log, a message or a result."""
    key = api_key()
    return text.replace(key, "***") if key and key in text else text


class RawStream:
    """What one request produced on the wire: timestamps and raw payloads, nothing parsed."""

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

    async def __aenter__(self) -> Client:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
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
            ) from err
        except aiohttp.ClientError as err:
            raise CeilingError(
                f"cannot reach {self.base}: {redact(str(err)) or type(err).__name__}",
                fix="check the host and port, and that the server is running",
            ) from err
        if status in (401, 403):
            raise CeilingError(
                f"{url} refused the request (HTTP {status})",
                fix="set CEILING_API_KEY (or OPENAI_API_KEY) to the server's API key",
            )
        if status == 404:
            raise CeilingError(
                f"{url} does not exist (HTTP 404): not an OpenAI-compatible API root",
                fix="pass the server root, e.g. --url http://127.0.0.1:8000",
            )
        if status != 200:
            if model:
                return model
            raise CeilingError(
                f"{url} answered HTTP {status}", fix="pass --model explicitly, or check the server"
            )
        ids = [m.get("id") for m in (body or {}).get("data", []) if isinstance(m, dict)]
        if model:
            return model
        if not ids:
            raise CeilingError(f"{url} lists no model", fix="pass --model explicitly")
        return str(ids[0])

    async def tokenize(self, model: str, text: str) -> int | None:
        """Token count of ``text`` from the server's ``/tokenize`` (vLLM, SGLang), or None."""
        try:
            tmo = aiohttp.ClientTimeout(total=10, connect=CONNECT_TIMEOUT_S)
            async with self.session.post(
                self.base + "/tokenize",
                json={"model": model, "prompt": text, "add_special_tokens": False},
                timeout=tmo,
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
        ``http_5xx``, ``timeout``, ``connection``) so that the run goes on.
        """
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
                while True:
                    data = await content.readany()
                    t = perf()
                    if not data:
                        break
                    if not raw.t_first_byte_ns:
                        raw.t_first_byte_ns = t
                    for payload in splitter.feed(data):
                        events.append((t, payload))
        except TimeoutError:
            raw.error_kind = "timeout"
            raw.error = f"no data for {self.stall_s:g} s or over {self.timeout_s:g} s in total"
        except aiohttp.ClientError as err:
            raw.error_kind = "connection"
            raw.error = redact(f"{type(err).__name__}: {err}")[:300]
        finally:
            raw.t_end_ns = perf()
            raw.leftover = splitter.leftover()
        return raw
