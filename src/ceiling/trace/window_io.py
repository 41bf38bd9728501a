"""A traced window's traffic with the server: the streams that keep the engine decoding, the
profiler's start and stop calls, and the /metrics scrapes that time the window from the engine's
side (:mod:`ceiling.trace.capture` runs the window). Every request goes through
:class:`ceiling.server.sync.SyncClient`: the one URL, credentials and proxy policy."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
from typing import Any

from ceiling.redact import redact
from ceiling.server.sync import SyncClient


class Streams:
    """``n`` streaming completions in threads, recording each chunk's arrival (epoch s)."""

    def __init__(self, url: str, model: str, n: int, max_tokens: int, extra: dict[str, Any]):
        self.client = SyncClient(url, timeout_s=120.0)
        self.url = self.client.base  # without credentials: it may reach a message
        self.model, self.max_tokens, self.extra = model, max_tokens, extra
        self.arrivals: list[list[float]] = [[] for _ in range(n)]
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True, name=f"capture-{i}")
            for i in range(n)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        body = {
            "model": self.model,
            "prompt": "Tell me a long story about a lighthouse keeper.",
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
            "stream": True,
            **self.extra,
        }
        data = json.dumps(body).encode()
        try:
            with self.client.open("/v1/completions", data, _JSON) as resp:
                for line in resp:
                    if self.stop.is_set():
                        break  # closing the connection aborts the request on the server
                    if line.startswith(b"data:") and not line.startswith(b"data: [DONE]"):
                        self.arrivals[i].append(time.time())
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            self.errors.append(f"stream {i}: {redact(str(exc))}")

    def tokens(self) -> int:
        return min((len(a) for a in self.arrivals), default=0)

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)


_JSON = {"Content-Type": "application/json"}


def post(
    url: str, path: str, body: dict[str, Any], timeout: float = 120.0
) -> tuple[int, str, float]:
    """A profiler call: POST ``body`` to ``url + path``: (status, text, seconds). Connection
    failures raise CeilingError."""
    return SyncClient(url).profiler(path, body, timeout)


def scrape(url: str) -> str | None:
    """The server's /metrics text (None: none served)."""
    return SyncClient(url).metrics(timeout_s=10.0)


def wait(cond: Any, timeout_s: float, poll_s: float = 0.01) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(poll_s)
    return bool(cond())
