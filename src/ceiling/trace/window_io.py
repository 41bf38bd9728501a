"""A traced window's traffic with the server: the streams that keep the engine decoding, the
profiler's start and stop calls, and the /metrics scrapes that time the window from the engine's
side (:mod:`ceiling.trace.capture` runs the window)."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from ceiling.bench.client import api_key
from ceiling.errors import CeilingError


class Streams:
    """``n`` streaming completions in threads, recording each chunk's arrival (epoch s)."""

    def __init__(self, url: str, model: str, n: int, max_tokens: int, extra: dict[str, Any]):
        self.url, self.model, self.max_tokens, self.extra = url, model, max_tokens, extra
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
        req = post_request(self.url + "/v1/completions", body)
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                for line in resp:
                    if self.stop.is_set():
                        break  # closing the connection aborts the request on the server
                    if line.startswith(b"data:") and not line.startswith(b"data: [DONE]"):
                        self.arrivals[i].append(time.time())
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            self.errors.append(f"stream {i}: {exc}")

    def tokens(self) -> int:
        return min((len(a) for a in self.arrivals), default=0)

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)


def post_request(url: str, body: dict[str, Any]) -> urllib.request.Request:
    headers = {"Content-Type": "application/json"}
    key = api_key()
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)


def post(url: str, body: dict[str, Any], timeout: float = 120.0) -> tuple[int, str, float]:
    """POST ``body``: (status, text, seconds). Connection failures raise CeilingError."""
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(post_request(url, body), timeout=timeout) as resp:
            return resp.status, resp.read(2000).decode(errors="replace"), time.monotonic() - t0
    except urllib.error.HTTPError as exc:
        text = exc.read(2000).decode(errors="replace") if exc.fp else ""
        return exc.code, text, time.monotonic() - t0
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise CeilingError(
            f"{url} did not answer ({exc})", fix="check that the server is running and the URL"
        ) from exc


def scrape(url: str) -> str | None:
    """The server's /metrics text (None: none served)."""
    req = urllib.request.Request(url + "/metrics")
    key = api_key()
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return str(resp.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        return None


def wait(cond: Any, timeout_s: float, poll_s: float = 0.01) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(poll_s)
    return bool(cond())
