"""The streaming request path: HTTP/1.1 on a bare asyncio protocol, stamped per socket read.

Each read arrives stamped on the ``time.perf_counter_ns()`` clock (CLOCK_MONOTONIC, system-wide
on Linux): with the kernel's receive time on plain TCP on Linux (:mod:`ceiling.bench.kstamp`
reads those sockets itself), else with the time ``data_received`` is called, the moment the
event loop hands the bytes over (TLS, other platforms). The rest of the read's work is a few
slices (HTTP chunk framing) and list appends; SSE splitting and JSON parsing wait until the
stream is over (:mod:`ceiling.bench.metrics`), and the request's task wakes up once, when its
response is complete, not once per chunk.

Hand-written on purpose (not aiohttp, h11 or httptools): the timestamp must be taken inside
``data_received`` and aiohttp exposes no public hook there (subclassing its protocol meant
setting the private ``connector._factory``); aiohttp's reader path (parser, StreamReader,
flow control, a task wake-up per read) and pure-Python h11 cost several times the few
microseconds per chunk this path takes, which is what limits a client at 1000+ streams;
httptools is a C extension we would have to ship. The HTTP subset a streaming completion
needs is small: one response per request on a keep-alive connection, framed by chunked
encoding, Content-Length or connection close (tested at every split point of the stream).
Everything else the client sends (``/v1/models``, ``/tokenize``, ``/metrics``) still goes
through aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

_perf_ns = time.perf_counter_ns
#: Longest status line + headers (or chunk-size line) we accept before calling it garbage.
MAX_HEAD = 64 * 1024

# Body framing of a response.
_CHUNKED, _LENGTH, _CLOSE = 1, 2, 3


class HTTPError(Exception):
    """The server's bytes are not a valid HTTP/1.1 response, or the connection ended early."""


class Sink:
    """Where one response goes: arrival stamps and payload, filled in by the protocol.

    ``reads[i]`` is the time of the i-th read that carried body bytes and ``ends[i]`` the body
    length (after de-chunking) once that read was consumed; ``parts`` are the body pieces.
    """

    __slots__ = ("ends", "parts", "reads", "size", "status", "t_first_byte_ns")

    def __init__(self) -> None:
        self.status = 0
        self.t_first_byte_ns = 0
        self.reads: list[int] = []
        self.ends: list[int] = []
        self.parts: list[bytes] = []
        self.size = 0


class StreamProtocol(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.sink: Sink | None = None
        self.done: asyncio.Future[None] | None = None
        self.closed = False
        self.reusable = False
        self.idle_since = 0.0
        self.last_read_ns = 0
        self._reset()

    def _reset(self) -> None:
        self._in_head = True
        self._head = b""
        self._framing = _CLOSE
        self._left = 0  # _LENGTH: body bytes still due; _CHUNKED: bytes left in this chunk
        self._crlf = 0  # _CHUNKED: bytes of the CRLF after a chunk still due
        self._trailer = False  # _CHUNKED: past the last chunk, reading trailer lines
        self._pending = b""  # _CHUNKED: an incomplete size or trailer line
        self._keep_alive = True
        self._plain_chunks = False  # data_received's fast path applies (see there)

    # -- asyncio callbacks -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        with contextlib.suppress(OSError, AttributeError):
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.feed(data, _perf_ns())

    def feed(self, data: bytes, t: int) -> None:
        """One read of the socket, stamped ``t`` (perf_counter_ns clock)."""
        self.last_read_ns = t
        sink = self.sink
        if self._plain_chunks and sink is not None:
            # The hot path (a chunked body, between chunks): the read is whole chunks,
            # "<hex>\r\n<data>\r\n" (one, or several that piled up in the socket). Whatever
            # is left after the last whole chunk (a partial one, the last-chunk marker) goes
            # through _read, the general parser.
            parts, n, i, added = sink.parts, len(data), 0, 0
            while i < n:
                j = data.find(b"\r\n", i, i + 18)
                if j <= i:
                    break
                try:
                    size = int(data[i:j], 16)
                except ValueError:  # chunk extensions and the like
                    break
                end = j + 2 + size
                if size <= 0 or end + 2 > n or data[end : end + 2] != b"\r\n":
                    break
                parts.append(data[j + 2 : end])
                added += size
                i = end + 2
            if added:
                sink.size += added
                sink.reads.append(t)
                sink.ends.append(sink.size)
                if i == n:
                    return
                data = data[i:]
        self._read(data, t)

    def _read(self, data: bytes, t: int) -> None:
        sink = self.sink
        if sink is None or self.done is None or self.done.done():
            # Bytes nobody asked for (after a complete response): the connection is unusable.
            self.reusable = False
            if self.transport is not None:
                self.transport.close()
            return
        try:
            if self._in_head:
                if not sink.t_first_byte_ns:
                    sink.t_first_byte_ns = t
                data = self._parse_head(data)
                if self._in_head or not data:
                    if not self._in_head and self._complete():
                        self._finish(None)
                    return
            if self._framing == _CHUNKED:
                added = self._body(data, sink.parts)
            else:
                payload = self._plain(data)
                if payload:
                    sink.parts.append(payload)
                added = len(payload)
        except HTTPError as err:
            self.fail(err)
            return
        if added:
            sink.size += added
            sink.reads.append(t)
            sink.ends.append(sink.size)
        if self._complete():
            self._finish(None)
        else:
            self._plain_chunks = self._framing == _CHUNKED and not (
                self._pending or self._left or self._crlf or self._trailer
            )

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        self.transport = None
        if self.done is not None and not self.done.done():
            if not self._in_head and self._framing == _CLOSE:
                self._finish(None)  # close-delimited body: EOF is the end
            else:
                why = f": {exc}" if exc else ""
                self.fail(HTTPError(f"server closed the connection mid-response{why}"))

    # -- parsing ---------------------------------------------------------------------------
    def _parse_head(self, data: bytes) -> bytes:
        """Consume status line + headers; return the body bytes that followed them."""
        buf = self._head + data if self._head else data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD:
                raise HTTPError("response headers too long")
            self._head = buf
            return b""
        self._head = b""
        lines = buf[:end].split(b"\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise HTTPError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(parts[1])
        rest = buf[end + 4 :]
        if 100 <= status < 200:  # interim response (100 Continue): the real one follows
            return self._parse_head(rest) if rest else b""
        assert self.sink is not None
        self.sink.status = status
        self._keep_alive = parts[0] == b"HTTP/1.1"
        framing, length = _CLOSE, -1
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            key = name.strip().lower()
            if key == b"transfer-encoding":
                if value.strip().lower().endswith(b"chunked"):
                    framing = _CHUNKED
            elif key == b"content-length":
                try:
                    length = int(value.strip())
                except ValueError as err:
                    raise HTTPError(f"bad Content-Length {value.strip()[:40]!r}") from err
            elif key == b"connection":
                tokens = value.strip().lower()
                if b"close" in tokens:
                    self._keep_alive = False
                elif b"keep-alive" in tokens:
                    self._keep_alive = True
        if framing != _CHUNKED and length >= 0:
            framing, self._left = _LENGTH, length
        self._framing = framing
        if framing == _CLOSE:
            self._keep_alive = False
        self._in_head = False
        return rest

    def _plain(self, data: bytes) -> bytes:
        if self._framing == _CLOSE:
            return data
        if len(data) > self._left:
            raise HTTPError("more body bytes than Content-Length")
        self._left -= len(data)
        return data

    def _body(self, data: bytes, out: list[bytes]) -> int:
        """De-chunk one read into ``out`` (the sink's parts); returns the payload bytes added."""
        buf = self._pending + data if self._pending else data
        self._pending = b""
        added = 0
        i, n = 0, len(buf)
        while i < n:
            left = self._left
            if left:
                take = left if left <= n - i else n - i
                out.append(buf[i : i + take] if take != n or i else buf)
                added += take
                i += take
                self._left = left - take
                if self._left == 0:
                    self._crlf = 2
                continue
            if self._crlf:
                # The CRLF that closes a chunk's data (may be split across reads).
                want = b"\r\n"[2 - self._crlf :]
                got = buf[i : i + len(want)]
                if not want.startswith(got):
                    raise HTTPError("chunk data not followed by CRLF")
                i += len(got)
                self._crlf -= len(got)
                continue
            j = buf.find(b"\r\n", i)
            if j < 0:
                if n - i > MAX_HEAD:
                    raise HTTPError("chunk-size line too long")
                self._pending = buf[i:]
                break
            line = buf[i:j]
            i = j + 2
            if self._trailer:
                if not line:  # the empty line after the trailers: response complete
                    self._trailer = False
                    self._framing = -1  # done
                    if i < n:
                        raise HTTPError("bytes after the end of the response")
                    break
                continue
            try:
                size = int(line, 16)
            except ValueError:  # chunk extensions ("1a;name=value")
                try:
                    size = int(line.split(b";", 1)[0], 16)
                except ValueError as err:
                    raise HTTPError(f"bad chunk-size line {line[:40]!r}") from err
            if size < 0:
                raise HTTPError(f"bad chunk-size line {line[:40]!r}")
            if size == 0:
                self._trailer = True
                continue
            end = i + size
            if end + 2 <= n:
                # The whole chunk and its CRLF are in this read (chunks that piled up in the
                # socket arrive many to a read): take it at once.
                if buf[end : end + 2] != b"\r\n":
                    raise HTTPError("chunk data not followed by CRLF")
                out.append(buf[i:end])
                added += size
                i = end + 2
            else:
                self._left = size
        return added

    def _complete(self) -> bool:
        if self._in_head:
            return False
        if self._framing == _LENGTH:
            return self._left == 0
        return self._framing == -1  # chunked, terminator seen (close-delimited: on EOF)

    def _finish(self, err: BaseException | None) -> None:
        self._plain_chunks = False
        done = self.done
        self.reusable = err is None and self._keep_alive and not self.closed
        if err is not None and self.transport is not None:
            self.transport.abort()
        if done is not None and not done.done():
            if err is None:
                done.set_result(None)
            else:
                done.set_exception(err)

    def fail(self, err: BaseException) -> None:
        """End the current response with ``err`` (parse error, stall): the connection goes."""
        self._finish(err)

    # -- driving one request ---------------------------------------------------------------
    def start(self, sink: Sink, request: bytes) -> asyncio.Future[None]:
        """Send ``request`` and return the future that completes with the response."""
        assert self.transport is not None
        self._reset()
        self.sink = sink
        self.reusable = False
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.done

    def abort(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()
