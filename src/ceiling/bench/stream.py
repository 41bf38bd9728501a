"""What one request produced on the wire (:class:`RawStream`), apart from the HTTP client.

Pure (bytes and timestamps in, SSE events out; no socket): the metrics
(:mod:`ceiling.bench.metrics`) read it and the client (:mod:`ceiling.bench.client`) fills it, so
the result nouns import this, not the client (tests/test_import_contract.py: the purity closure).
"""

from __future__ import annotations

from ceiling.bench.sse import SSESplitter


class RawStream:
    """What one request produced on the wire: timestamps and raw bytes, nothing parsed.

    ``reads``/``ends``: the time of each socket read that carried body bytes and the body
    length once it was consumed; ``parts``: the body. ``events`` (``(arrival ns, payload)``
    per SSE event, arrival = the read that completed the event) is split from them on first
    use; it can also be set directly.
    """

    __slots__ = (
        "_events",
        "_leftover",
        "ends",
        "error",
        "error_kind",
        "parts",
        "reads",
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
        self.reads: list[int] = []
        self.ends: list[int] = []
        self.parts: list[bytes] = []
        self.error_kind: str | None = None
        self.error: str | None = None
        self._events: list[tuple[int, bytes]] | None = None
        self._leftover = b""

    @property
    def events(self) -> list[tuple[int, bytes]]:
        if self._events is None:
            self._split()
        return self._events  # type: ignore[return-value]

    @events.setter
    def events(self, value: list[tuple[int, bytes]]) -> None:
        self._events = value

    @property
    def leftover(self) -> bytes:
        """Bytes after the last complete event (non-empty means a truncated stream)."""
        if self._events is None:
            self._split()
        return self._leftover

    @leftover.setter
    def leftover(self, value: bytes) -> None:
        self._leftover = value

    def _split(self) -> None:
        splitter = SSESplitter()
        found = splitter.feed(b"".join(self.parts))
        self._leftover = splitter.leftover()
        reads, ends = self.reads, self.ends
        out: list[tuple[int, bytes]] = []
        i, last = 0, len(ends) - 1
        for payload, end in found:
            while i < last and ends[i] < end:
                i += 1
            out.append((reads[i], payload))
        self._events = out
