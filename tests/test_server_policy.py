"""One HTTP policy (issue 40): every path that reaches a server sends through the same URL,
credentials and proxy rules (ceiling.server.policy). Each path below makes its real requests
against a local stub server, with a stub proxy in the environment:

- a loopback URL goes directly, whatever HTTP_PROXY says;
- a remote-looking host (``remote.test``, which no DNS knows) goes through the proxy (the proxy
  forwards to the stub: a request that arrives proves it went through it), unless NO_PROXY
  names it;
- ``user:password@`` in the URL becomes ``Authorization: Basic`` on every request, the
  environment's API key ``Bearer``; the password reaches no output and no result.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from ceiling.bench.client import Client
from ceiling.bench.pool import StreamPool
from ceiling.deploy.ready import wait_ready
from ceiling.errors import CeilingError
from ceiling.flows import target as doctor_target
from ceiling.redact import redact
from ceiling.run.launcher import Server
from ceiling.sanity.checks import _Server as SanityServer
from ceiling.server.policy import Target, is_loopback, proxy_for, target
from ceiling.server.sync import served_models
from ceiling.trace import window_io
from http_stub import serve
from proxy_stub import ProxyLog, proxy

PASSWORD = "pa55-w0rd-never-shown"
KEY = "sk-env-key-never-shown"


class _Stub(BaseHTTPRequestHandler):
    """The endpoints every path asks; each request's path and headers are recorded."""

    seen: list[tuple[str, dict[str, str]]]
    protocol_version = "HTTP/1.1"

    def _send(self, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.seen.append((self.path, dict(self.headers)))
        answers = {
            "/v1/models": {"data": [{"id": "m", "owned_by": "vllm", "max_model_len": 4096}]},
            "/health": {},
            "/version": {"version": "0.11.0"},
        }
        if self.path == "/metrics":
            self._send(b"vllm:num_requests_running 0\n", "text/plain")
        elif self.path in answers:
            self._send(json.dumps(answers[self.path]).encode())
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        self.seen.append((self.path, dict(self.headers)))
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"{}")
        if body.get("stream"):
            self._send(b'data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n', "text/event-stream")
        else:
            self._send(json.dumps({"choices": [{"text": " Paris"}]}).encode())

    def log_message(self, *args: object) -> None:
        pass


def _bench(url: str) -> list[Any]:
    async def go() -> list[Any]:
        async with Client(url, timeout_s=10) as client:
            model = await client.detect_model(None)
            body = json.dumps({"model": model, "prompt": "a", "max_tokens": 2, "stream": True})
            raw = await client.stream("/v1/completions", body.encode())
            assert raw.error_kind is None, raw.error
            # what the result records of the URL: runner.py writes redact(client.base)
            return [model, redact(client.base), raw.error, await client.get_text("/metrics")]

    return asyncio.run(go())


def _trace_capture(url: str) -> list[Any]:
    gen = window_io.Streams(url, "m", 1, 2, {})
    gen.start()
    for t in gen.threads:  # the stub's stream ends by itself: read it all
        t.join(timeout=10)
    gen.close()
    assert not gen.errors and gen.tokens() >= 1, gen.errors
    status, text, _ = window_io.post(url, "/start_profile", {})
    assert status == 200
    return [text, window_io.scrape(url), gen.errors, gen.url]


def _sanity(url: str) -> list[Any]:
    srv = SanityServer(url, "m", 5.0)
    return [srv.models(), srv.complete({"prompt": "The capital of France is"}), srv.url]


def _launcher(url: str) -> list[Any]:
    # The launcher polls the server it started (its own host:port, its own key), never a URL
    # a user typed: the remote and credentials cases do not apply (see the launcher test).
    srv = Server.__new__(Server)
    srv.host, srv.port, srv.api_key = "127.0.0.1", int(url.rsplit(":", 1)[1]), KEY
    status, _ = srv._http_get("/health")
    assert status == 200
    return [srv.url]


def _deploy_ready(url: str) -> list[Any]:
    return [wait_ready(url, ["/health"], timeout_s=10, interval_s=0.05)]


def _doctor_target(url: str) -> list[Any]:
    assert doctor_target.server_alive(url)
    return [doctor_target.served_models(url), doctor_target.server_version(url, "/version")]


PATHS: dict[str, Callable[[str], list[Any]]] = {
    "bench": _bench,
    "served": lambda url: [served_models(url)],
    "trace capture": _trace_capture,
    "sanity": _sanity,
    "deploy readiness": _deploy_ready,
    "doctor target": _doctor_target,
}
ALL = {**PATHS, "launcher readiness": _launcher}


@pytest.fixture
def stub() -> Iterator[tuple[str, list[tuple[str, dict[str, str]]], ProxyLog]]:
    """(server URL, the server's request log, the proxy's log), the proxy in the environment."""
    seen: list[tuple[str, dict[str, str]]] = []
    with (
        serve(type("S", (_Stub,), {"seen": seen})) as url,
        proxy() as log,
        pytest.MonkeyPatch.context() as mp,
    ):
        for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
            mp.delenv(name, raising=False)
            mp.delenv(name.upper(), raising=False)
        for name in ("CEILING_API_KEY", "OPENAI_API_KEY"):
            mp.delenv(name, raising=False)
        mp.setenv("HTTP_PROXY", log.url)
        yield url, seen, log


@pytest.mark.parametrize("path", list(ALL))
def test_loopback_goes_direct_whatever_http_proxy_says(stub, path):
    url, seen, log = stub
    ALL[path](url)
    assert seen, "the server got no request"
    assert log.seen == [], f"{path} sent through the proxy: {log.seen}"


@pytest.mark.parametrize("path", list(PATHS))
def test_a_remote_host_goes_through_the_proxy(stub, path):
    url, seen, log = stub
    remote = url.replace("127.0.0.1", "remote.test")
    PATHS[path](remote)
    assert log.seen and seen, f"{path} did not reach the server through the proxy"
    assert all(u.startswith("http://remote.test:") for _m, u, _h in log.seen)
    assert len(seen) == len(log.seen)  # every request it sent went through the proxy


@pytest.mark.parametrize("path", list(PATHS))
def test_no_proxy_sends_a_remote_host_direct(stub, path, monkeypatch):
    url, seen, log = stub
    monkeypatch.setenv("NO_PROXY", "remote.test")
    with pytest.raises((CeilingError, AssertionError)):  # no DNS knows it: no answer
        PATHS[path](url.replace("127.0.0.1", "remote.test"))
    assert log.seen == [] and seen == []


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("via", ["direct", "proxy"])
def test_url_credentials_become_basic_auth_and_never_show(stub, path, via, capsys, caplog):
    url, seen, log = stub
    caplog.set_level(logging.DEBUG)
    host = "127.0.0.1" if via == "direct" else "remote.test"
    results = PATHS[path](url.replace("http://127.0.0.1", f"http://us%40er:{PASSWORD}@{host}"))
    want = "Basic " + base64.b64encode(f"us@er:{PASSWORD}".encode()).decode()
    assert seen and all(h.get("Authorization") == want for _p, h in seen), (path, seen)
    assert all("@" not in u for _m, u, _h in log.seen)  # the URL itself carries none
    out = capsys.readouterr()
    shown = out.out + out.err + caplog.text + repr(results)
    assert PASSWORD not in shown and "us%40er" not in shown


@pytest.mark.parametrize("path", list(ALL))
def test_the_api_key_goes_as_bearer_everywhere(stub, path, monkeypatch, capsys):
    url, seen, _log = stub
    monkeypatch.setenv("CEILING_API_KEY", KEY)
    results = ALL[path](url)
    assert seen and all(h.get("Authorization") == f"Bearer {KEY}" for _p, h in seen), seen
    assert KEY not in repr(results) + capsys.readouterr().out


def test_the_launcher_sends_its_own_server_direct_even_on_a_non_loopback_host(stub):
    """A variant that binds a routable address: still this host, still never a proxy."""
    url, _seen, log = stub
    srv = Server.__new__(Server)
    srv.host, srv.port, srv.api_key = "remote.test", int(url.rsplit(":", 1)[1]), None
    assert srv._http_get("/health") == (None, None)  # direct: no DNS knows it
    assert log.seen == []


# -- the policy itself ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loop"),
    [("localhost", True), ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True),
     ("[::1]", True), ("10.0.0.1", False), ("example.com", False), ("localhost.com", False)],
)  # fmt: skip
def test_loopback_hosts(host, loop):
    assert is_loopback(host) is loop


def test_proxy_choice_follows_scheme_no_proxy_and_direct(monkeypatch):
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "proxy.corp:3128")
    monkeypatch.setenv("HTTPS_PROXY", "http://tls-proxy.corp:3128")
    monkeypatch.setenv("NO_PROXY", ".internal,10.1.2.3")
    assert proxy_for("http://gpu.example:8000") == "http://proxy.corp:3128"
    assert proxy_for("https://gpu.example") == "http://tls-proxy.corp:3128"
    assert proxy_for("http://a.internal:8000") is None
    assert proxy_for("http://10.1.2.3:8000") is None
    assert proxy_for("http://localhost:8000") is None
    assert proxy_for("http://gpu.example:8000", direct=True) is None


def test_url_credentials_and_an_api_key_together_name_the_problem_and_the_fix(monkeypatch):
    monkeypatch.setenv("CEILING_API_KEY", KEY)
    with pytest.raises(CeilingError) as info:
        target(f"http://u:{PASSWORD}@127.0.0.1:8000")
    assert "one Authorization header" in info.value.message
    assert "drop the credentials" in info.value.fix
    assert PASSWORD not in info.value.message + info.value.fix


def test_the_target_strips_credentials_and_a_trailing_v1():
    tgt = target(f"http://u:{PASSWORD}@127.0.0.1:8000/v1/")
    assert tgt.base == "http://127.0.0.1:8000"
    assert tgt.authorization == "Basic " + base64.b64encode(f"u:{PASSWORD}".encode()).decode()


@pytest.mark.parametrize("path", list(PATHS))
def test_url_credentials_and_an_api_key_are_refused_on_every_path(stub, path, monkeypatch):
    """Before: the bench refused them, ``/v1/models`` silently preferred the URL's."""
    url, seen, _log = stub
    monkeypatch.setenv("CEILING_API_KEY", KEY)
    with pytest.raises(CeilingError, match="one Authorization header"):
        PATHS[path](url.replace("http://", f"http://u:{PASSWORD}@"))
    assert seen == []


@pytest.mark.parametrize(("answer", "ok"), [(b"HTTP/1.1 200 Connection established", True),
                                            (b"HTTP/1.1 407 Proxy Authentication Required", False)])  # fmt: skip
def test_the_streaming_pool_tunnels_https_through_the_proxy_with_connect(answer, ok):
    """https via a proxy: CONNECT host:port (with the proxy's own credentials), then TLS inside;
    a refused tunnel is a connection error the stream reports."""
    listener = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def proxy_side() -> None:
        conn, _ = listener.accept()
        got.append(conn.recv(4096))
        conn.sendall(answer + b"\r\n\r\n")
        conn.close()

    threading.Thread(target=proxy_side, daemon=True).start()
    tgt = Target(
        "https://gpu.example:8443", None, f"http://pu:pp@127.0.0.1:{listener.getsockname()[1]}"
    )
    pool = StreamPool(tgt, {}, 4.0)

    async def go() -> socket.socket:
        return await pool._tunnel(socket.AF_INET, listener.getsockname())

    try:
        if ok:
            asyncio.run(go()).close()
        else:
            with pytest.raises(OSError, match="refused a tunnel"):
                asyncio.run(go())
    finally:
        pool.close()
        listener.close()
    head = got[0].decode()
    assert head.startswith("CONNECT gpu.example:8443 HTTP/1.1\r\n")
    assert "Proxy-Authorization: Basic " + base64.b64encode(b"pu:pp").decode() in head
