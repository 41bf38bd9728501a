"""Incremental Server-Sent-Events splitter: bytes in, complete ``data`` payloads out.

The client timestamps socket reads *before* handing the bytes to this splitter, and the
splitter does no JSON work at all: parsing happens after the stream has ended, so it can never
delay a timestamp. Each payload comes with the stream offset of the end of its event, so that
the client can give every event the arrival time of the bytes that completed it. Handles ``\\n``
and ``\\r\\n`` line ends, comments (``: keep-alive``), multi-line ``data:`` fields and events
split across reads.
"""

from __future__ import annotations


def _payload(block: bytes) -> bytes | None:
    """The ``data`` of one event block (lines already split by ``\\n``), or None."""
    if block.startswith(b"data:") and b"\n" not in block:
        # The common case: one data line per event.
        payload = block[5:]
        return payload[1:] if payload[:1] == b" " else payload
    lines = [ln for ln in block.split(b"\n") if ln.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(ln[6:] if ln[5:6] == b" " else ln[5:] for ln in lines)


class SSESplitter:
    """Feed raw bytes; get back ``(payload, end_offset)`` for every event completed so far."""

    __slots__ = ("_base", "_buf")

    def __init__(self) -> None:
        self._buf = b""
        self._base = 0  # stream offset of _buf[0]

    def feed(self, data: bytes) -> list[tuple[bytes, int]]:
        """Events terminated within ``data``: payload and stream offset just past the event."""
        buf = self._buf + data if self._buf else data
        out: list[tuple[bytes, int]] = []
        start = 0
        find = buf.find
        while True:
            end = find(b"\n\n", start)
            if end >= 0 and find(b"\r", start, end) < 0:
                sep = 2
                if buf.startswith(b"data: ", start) and find(b"\n", start, end) < 0:
                    # The common case: one "data: " line per event, LF framing.
                    out.append((buf[start + 6 : end], self._base + end + 2))
                    start = end + 2
                    continue
            else:
                # CRLF (or CR) framing: find the earliest blank line of any style.
                cands = [
                    (i, n)
                    for i, n in (
                        (find(sp, start), len(sp)) for sp in (b"\n\n", b"\r\n\r\n", b"\r\r")
                    )
                    if i >= 0
                ]
                if not cands:
                    break
                end, sep = min(cands)
            block = buf[start:end]
            if b"\r" in block:
                block = block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            start = end + sep
            payload = _payload(block)
            if payload is not None:
                out.append((payload, self._base + start))
        if start:
            self._buf = buf[start:]
            self._base += start
        else:
            self._buf = buf
        return out

    def leftover(self) -> bytes:
        """Bytes received after the last complete event (non-empty means a truncated stream)."""
        return self._buf
