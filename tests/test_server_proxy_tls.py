"""``https://`` through an HTTP proxy (CONNECT): docs/server.md says a remote server is reached
through HTTP(S)_PROXY; for TLS that is a CONNECT tunnel. A local HTTPS server with a self-signed
certificate for ``remote.test`` (made with the ``openssl`` CLI: neither ``cryptography`` nor
``trustme`` is in the environment), trusted through ``SSL_CERT_FILE``, is reachable only through
the proxy (no DNS knows ``remote.test``): both clients must tunnel and verify the certificate."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ceiling.server.aio import AsyncClient
from ceiling.server.policy import target
from ceiling.server.sync import SyncClient
from proxy_stub import proxy

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")


class _Models(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"data": [{"id": "tiny", "owned_by": "vllm"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def cert(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(d / "key.pem"),
            "-out",
            str(d / "cert.pem"),
            "-subj",
            "/CN=remote.test",
            "-addext",
            "subjectAltName=DNS:remote.test",
        ],
        check=True,
        capture_output=True,
    )
    return d


@contextlib.contextmanager
def https_server(cert: Path) -> Iterator[int]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert / "cert.pem", cert / "key.pem")
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def remote(cert, monkeypatch) -> Iterator[tuple[str, list]]:
    """(https URL of a 'remote' host, the proxy's log), the proxy in the environment."""
    monkeypatch.setenv("SSL_CERT_FILE", str(cert / "cert.pem"))
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    with https_server(cert) as port, proxy() as log:
        monkeypatch.setenv("HTTPS_PROXY", log.url)
        yield f"https://remote.test:{port}", log.seen


def test_the_policy_sends_a_remote_https_url_through_the_proxy(remote):
    url, _ = remote
    assert target(url).proxy is not None


def test_the_sync_client_tunnels_https_through_the_proxy(remote):
    url, seen = remote
    assert [m.id for m in SyncClient(url).models()] == ["tiny"]
    assert [(m, p) for m, p, _ in seen] == [("CONNECT", url.removeprefix("https://"))]


def test_the_async_client_tunnels_https_through_the_proxy(remote):
    url, seen = remote

    async def ask() -> tuple[int, object]:
        async with AsyncClient(target(url)) as client:
            return await client.get_json("/v1/models")

    status, body = asyncio.run(ask())
    assert status == 200 and body["data"][0]["id"] == "tiny"
    assert [(m, p) for m, p, _ in seen] == [("CONNECT", url.removeprefix("https://"))]
