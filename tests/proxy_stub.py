"""A forward HTTP proxy on a free local port, for the tests of ceiling's proxy policy.

It records every request that reached it (the absolute URL in the request line, the headers)
and forwards it to ``127.0.0.1`` at the URL's port, whatever the host name: a "remote" host
(``http://remote.test:PORT``) that no DNS knows reaches the local stub server only through
this proxy, so a request that arrives proves the client went through the proxy.

``CONNECT host:PORT`` (how a client reaches an ``https://`` URL through a proxy) is answered with
a tunnel to ``127.0.0.1:PORT``: the proxy records the request and then only relays bytes, so
the TLS handshake is the client's with the server behind it.
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


@dataclass
class ProxyLog:
    url: str = ""
    seen: list[tuple[str, str, dict[str, str]]] = field(
        default_factory=list
    )  # method, URL, headers


class _Forward(BaseHTTPRequestHandler):
    log: ProxyLog

    def _forward(self) -> None:
        self.log.seen.append((self.command, self.path, dict(self.headers)))
        parts = urlsplit(self.path)
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        headers = {k: v for k, v in self.headers.items() if not k.lower().startswith("proxy-")}
        conn = http.client.HTTPConnection("127.0.0.1", parts.port or 80, timeout=30)
        try:
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            conn.request(self.command, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except OSError:
            self.send_error(502)
            return
        finally:
            conn.close()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _forward

    def do_CONNECT(self) -> None:
        self.log.seen.append((self.command, self.path, dict(self.headers)))
        port = int(self.path.rpartition(":")[2])
        try:
            upstream = socket.create_connection(("127.0.0.1", port), timeout=30)
        except OSError:
            self.send_error(502)
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        ends = [self.connection, upstream]
        with upstream:
            while True:
                ready, _, _ = select.select(ends, [], [], 30)
                if not ready:
                    break
                for end in ready:
                    data = end.recv(65536)
                    if not data:
                        return
                    (upstream if end is self.connection else self.connection).sendall(data)
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def proxy() -> Iterator[ProxyLog]:
    """The proxy's log (``.url``: ``http://127.0.0.1:PORT``) while the block runs."""
    log = ProxyLog()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), type("P", (_Forward,), {"log": log}))
    log.url = f"http://127.0.0.1:{srv.server_address[1]}"
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield log
    finally:
        srv.shutdown()
        srv.server_close()
