"""A stdlib HTTP handler served on a free local port for the length of a ``with`` block: the
tests' stand-in for a server's few plain endpoints (``/v1/models``, ``/props``, profiler calls)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _JoinedServer(ThreadingHTTPServer):
    """Handler threads are joined at close, so a stream still writing to a client that left
    ends inside its own test instead of printing into a later test's stderr."""

    daemon_threads = False
    block_on_close = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client hanging up mid-stream is how these tests end a stream


@contextlib.contextmanager
def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """The server's base URL while the block runs; shut down and joined after it."""
    srv = _JoinedServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
