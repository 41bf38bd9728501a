"""The asynchronous client (aiohttp): the bench's calls that are no timed stream (preflight
``/v1/models``, ``/tokenize``, ``/metrics`` scrapes), on one pooled session. URL, credentials,
proxy and timeouts are :mod:`ceiling.server.policy`'s, like the sync client's and like the
bench's streaming pool (:mod:`ceiling.bench.pool`), which takes the same :class:`Target`.
"""

from __future__ import annotations

import json
import ssl
from typing import Any

import aiohttp

from ceiling.server.policy import CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S, Target


class AsyncClient:
    """One aiohttp session to ``tgt.base`` (use as ``async with``): Authorization and proxy
    from the policy; ``headers`` added to every request; ``timeout`` the session's default."""

    def __init__(
        self,
        tgt: Target,
        headers: dict[str, str] | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> None:
        self.target = tgt
        self.base = tgt.base
        self.headers = {**(headers or {}), **tgt.headers}
        self.timeout = timeout or aiohttp.ClientTimeout(
            total=REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S
        )
        self._session: aiohttp.ClientSession | None = None
        # the system's trust store as it is now (SSL_CERT_FILE/SSL_CERT_DIR included), as the
        # sync client and the streaming pool read it; aiohttp's own default context is made
        # once, when aiohttp is imported
        self._ssl = ssl.create_default_context()

    def _new_session(self, connector: aiohttp.BaseConnector) -> aiohttp.ClientSession:
        # trust_env stays off: the proxy is the policy's decision (loopback never goes through
        # one), not aiohttp's reading of the environment.
        return aiohttp.ClientSession(
            connector=connector,
            headers=self.headers,
            auto_decompress=False,
            timeout=self.timeout,
            proxy=self.target.proxy,
        )

    async def __aenter__(self) -> AsyncClient:
        self._session = self._new_session(
            aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, ssl=self._ssl)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use AsyncClient as an async context manager"
        return self._session

    @staticmethod
    def _timeout(timeout_s: float) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=timeout_s, connect=CONNECT_TIMEOUT_S)

    async def get_json(self, path: str, timeout_s: float = REQUEST_TIMEOUT_S) -> tuple[int, Any]:
        """(status, JSON body or None). Connection failures raise (aiohttp.ClientError,
        TimeoutError): the caller words them."""
        async with self.session.get(self.base + path, timeout=self._timeout(timeout_s)) as resp:
            try:
                body = await resp.json(content_type=None)
            except (json.JSONDecodeError, aiohttp.ContentTypeError, UnicodeDecodeError):
                body = None
            return resp.status, body

    async def post_json(
        self, path: str, payload: dict[str, Any], timeout_s: float = 10.0
    ) -> tuple[int, Any]:
        """(status, JSON body or None) of a POST; connection failures raise as in get_json."""
        tmo = self._timeout(timeout_s)
        async with self.session.post(self.base + path, json=payload, timeout=tmo) as resp:
            if resp.status != 200:
                return resp.status, None
            return resp.status, await resp.json(content_type=None)

    async def get_text(
        self, path: str, timeout_s: float = REQUEST_TIMEOUT_S, fresh: bool = False
    ) -> str | None:
        """GET a text resource (``/metrics``); None when absent or unreachable.

        A failed answer (no answer in time, a dropped connection, a 5xx) is asked once more on
        a new connection: one lost ``/metrics`` scrape costs a whole level its engine counters
        (a level's deltas need every repeat's two scrapes), and a pooled keep-alive connection
        that the server closed as idle (uvicorn's default: after 5 s) or one slow answer of a
        busy API server are no reason to lose them. A 4xx (no such endpoint) is final.
        ``fresh``: on a new connection from the start, and asked once (a liveness check must
        not ride on a pooled connection that outlived the server's listening socket, and must
        answer "dead" without a second wait).
        """
        tmo = self._timeout(timeout_s)
        for attempt in range(1 if fresh else 2):
            new = fresh or attempt > 0
            try:
                if new:
                    conn = aiohttp.TCPConnector(force_close=True, ssl=self._ssl)
                    async with (
                        self._new_session(conn) as one,
                        one.get(self.base + path, timeout=tmo) as resp,
                    ):
                        status, text = resp.status, await resp.text()
                else:
                    async with self.session.get(self.base + path, timeout=tmo) as resp:
                        status, text = resp.status, await resp.text()
            except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
                continue
            if status == 200:
                return text
            if status < 500:
                return None
        return None

    async def metrics(self, timeout_s: float = REQUEST_TIMEOUT_S) -> str | None:
        """The server's ``/metrics`` text (None: none served, or no answer)."""
        return await self.get_text("/metrics", timeout_s)
