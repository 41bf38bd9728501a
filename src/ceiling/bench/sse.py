"""Incremental Server-Sent-Events splitter: bytes in, complete ``data`` payloads out.

The client timestamps each socket read *before* handing the bytes to this splitter, and the
splitter does no JSON work at all: parsing happens after the stream has ended, so it can never
delay a timestamp. Handles ``\\n`` and ``\\r\\n`` line ends, comments (``: keep-alive``),
multi-line ``data:`` fields and events split across reads.
"""

from __future__ import annotations


class SSESplitter:
    """Feed raw bytes; get back the ``data`` payload (bytes) of every event completed so far."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Return payloads of events terminated within ``data`` (possibly none)."""
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        out: list[bytes] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            block = buf[start:end]
            start = end + 2
            if block.startswith(b"data:") and b"\n" not in block:
                # The common case: one data line per event.
                payload = block[5:]
                out.append(payload[1:] if payload[:1] == b" " else payload)
                continue
            lines = [ln for ln in block.split(b"\n") if ln.startswith(b"data:")]
            if lines:
                parts = [ln[5:][1:] if ln[5:6] == b" " else ln[5:] for ln in lines]
                out.append(b"\n".join(parts))
        self._buf = buf[start:]
        return out

    def leftover(self) -> bytes:
        """Bytes received after the last complete event (non-empty means a truncated stream)."""
        return self._buf
