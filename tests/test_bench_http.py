"""The streaming HTTP/1.1 path: framing at every split point, stamps per read, errors, pool."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from ceiling.bench.client import Client, RawStream
from ceiling.bench.http import HTTPError, Sink, StreamProtocol
from ceiling.bench.metrics import process
from sse_server import Plan, SSEServer


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.aborted = True

    def get_extra_info(self, _name: str) -> Any:
        return None


def _events(n: int) -> list[bytes]:
    return [
        b"data: " + json.dumps({"choices": [{"text": f"t{i}"}]}).encode() + b"\n\n"
        for i in range(n)
    ]


def _chunked(payloads: list[bytes], ext: bool = False, trailer: bool = False) -> bytes:
    out = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    for p in payloads:
        out += b"%x%s\r\n%s\r\n" % (len(p), b";x=1" if ext else b"", p)
    return out + (b"0\r\nX-Trailer: y\r\n\r\n" if trailer else b"0\r\n\r\n")


def _feed(reads: list[bytes]) -> tuple[StreamProtocol, Sink, asyncio.Future[None]]:
    """Feed reads to a protocol, outside a running loop's I/O (stamps still taken per read)."""
    loop = asyncio.new_event_loop()
    try:
        proto = StreamProtocol()
        proto.connection_made(_Transport())  # type: ignore[arg-type]
        sink = Sink()

        async def go() -> asyncio.Future[None]:
            fut = proto.start(sink, b"GET / HTTP/1.1\r\n\r\n")
            for r in reads:
                proto.data_received(r)
            return fut

        fut = loop.run_until_complete(go())
    finally:
        loop.close()
    return proto, sink, fut


def test_chunked_body_survives_every_split_point() -> None:
    payloads = _events(3)
    wire = _chunked(payloads)
    body = b"".join(payloads)
    for cut in range(1, len(wire)):
        for ext, trailer in ((False, False), (True, True)):
            wire = _chunked(payloads, ext=ext, trailer=trailer)
            cut = min(cut, len(wire) - 1)
            proto, sink, fut = _feed([wire[:cut], wire[cut:]])
            assert fut.done() and fut.exception() is None, (cut, ext)
            assert b"".join(sink.parts) == body and sink.status == 200
            assert sink.ends[-1] == len(body) and proto.reusable


def test_three_reads_at_many_split_pairs_keep_payload_and_stamps() -> None:
    # Reads holding several whole chunks and then part of one (a client behind its sockets).
    payloads = _events(5)
    wire = _chunked(payloads)
    body = b"".join(payloads)
    for a in range(40, len(wire), 13):
        for b in range(a + 1, len(wire), 11):
            _, sink, fut = _feed([wire[:a], wire[a:b], wire[b:]])
            assert fut.done() and fut.exception() is None, (a, b)
            assert b"".join(sink.parts) == body, (a, b)
            assert sink.ends[-1] == len(body) and sink.ends == sorted(sink.ends)
            assert len(sink.reads) == len(sink.ends)


def test_one_byte_reads_stamp_each_read_and_events_get_the_completing_read() -> None:
    payloads = _events(2)
    wire = _chunked(payloads)
    _proto, sink, fut = _feed([wire[i : i + 1] for i in range(len(wire))])
    assert fut.done() and fut.exception() is None
    assert len(sink.reads) == len(sink.ends) == sum(len(p) for p in payloads)
    assert sink.reads == sorted(sink.reads)
    raw = RawStream()
    raw.reads, raw.ends, raw.parts = sink.reads, sink.ends, sink.parts
    # Each event is stamped with the read that carried its last byte.
    ends = [len(payloads[0]), len(payloads[0]) + len(payloads[1])]
    assert [t for t, _ in raw.events] == [sink.reads[e - 1] for e in ends]
    assert [p for _, p in raw.events] == [p[6:-2] for p in payloads]


def test_content_length_close_delimited_and_interim_responses() -> None:
    body = b"data: x\n\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    _, sink, fut = _feed([b"HTTP/1.1 100 Continue\r\n\r\n" + head[:10], head[10:] + body])
    assert fut.done() and b"".join(sink.parts) == body
    proto, sink, fut = _feed([b"HTTP/1.0 200 OK\r\n\r\n", body])
    assert not fut.done()  # close-delimited: the end is EOF
    proto.connection_lost(None)
    assert fut.done() and fut.exception() is None and not proto.reusable
    assert b"".join(sink.parts) == body


@pytest.mark.parametrize(
    ("wire", "match"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "status line"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n", "chunk-size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXX", "CRLF"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabc", "Content-Length"),
    ],
)
def test_malformed_responses_fail_the_request(wire: bytes, match: str) -> None:
    proto, _, fut = _feed([wire])
    assert fut.done() and isinstance(fut.exception(), HTTPError)
    assert match in str(fut.exception())
    assert not proto.reusable and proto.transport.aborted  # type: ignore[union-attr]


def test_connection_lost_mid_stream_is_an_error() -> None:
    wire = _chunked(_events(3))
    proto, _, fut = _feed([wire[: len(wire) // 2]])
    proto.connection_lost(ConnectionResetError("reset"))
    assert isinstance(fut.exception(), HTTPError) and "mid-response" in str(fut.exception())


async def _stream_twice(url: str) -> tuple[RawStream, RawStream, int]:
    body = json.dumps({"model": "m", "prompt": "a", "max_tokens": 5, "stream": True}).encode()
    async with Client(url, timeout_s=30) as client:
        a = await client.stream("/v1/completions", body)
        b = await client.stream("/v1/completions", body)
        return a, b, len(client._pool._all)  # type: ignore[union-attr]


def test_keep_alive_connection_is_reused_and_http_errors_keep_their_text() -> None:
    with SSEServer(Plan(itl_s=0.001)) as srv:
        a, b, conns = asyncio.run(_stream_twice(srv.url))
    assert conns == 1  # one connection carried both requests
    for raw in (a, b):
        rec = process(raw, 0, max_tokens=5)
        assert rec.ok and rec.output_tokens == 5 and not raw.leftover
    with SSEServer(Plan(status=503, error_message="overloaded")) as srv:
        a, _, _ = asyncio.run(_stream_twice(srv.url))
    assert a.error_kind == "http_5xx" and "overloaded" in (a.error or "")


def test_a_stale_keep_alive_connection_is_retried_on_a_fresh_one() -> None:
    # A server that answers the first request on a connection and closes the connection,
    # unanswered, when a second request arrives on it (an idle keep-alive timeout racing us).
    response = _chunked([*_events(1), b"data: [DONE]\n\n"])
    served: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = 0
        while not reader.at_eof():
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            n += 1
            if n > 1:
                writer.close()
                return
            served.append(n)
            writer.write(response)
            await writer.drain()

    async def go() -> tuple[RawStream, RawStream, int]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        body = json.dumps({"model": "m", "prompt": "a", "stream": True}).encode()
        try:
            async with Client(f"http://127.0.0.1:{port}", timeout_s=30) as client:
                a = await client.stream("/v1/completions", body)
                b = await client.stream("/v1/completions", body)  # reused, dropped, retried
                return a, b, len(served)
        finally:
            server.close()

    a, b, n_served = asyncio.run(go())
    assert a.error_kind is None and b.error_kind is None, b.error
    assert n_served == 2  # the retry went to a fresh connection
    assert process(b, 0, max_tokens=1).ok


def test_kernel_stamps_are_arrival_times_even_when_the_loop_is_late() -> None:
    """A busy event loop reads late; the kernel's receive time does not move with it."""
    import socket
    import time

    from ceiling.bench.kstamp import SO_TIMESTAMPNS, KernelStampedSocket, kernel_stamps_supported

    if not kernel_stamps_supported():
        pytest.skip("no SO_TIMESTAMPNS on this platform")

    async def go() -> tuple[int, int, Sink]:
        loop = asyncio.get_running_loop()
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        client = socket.socket()
        client.setblocking(False)
        client.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        await asyncio.sleep(0.1)  # the kernel switches timestamping on a few ms after asked
        await loop.sock_connect(client, ("127.0.0.1", port))
        server, _ = listener.accept()
        proto = StreamProtocol()
        proto.connection_made(KernelStampedSocket(loop, client, proto))  # type: ignore[arg-type]
        sink = Sink()
        fut = proto.start(sink, b"GET / HTTP/1.1\r\n\r\n")
        body = b"data: x\n\n"
        t_sent = time.perf_counter_ns()
        server.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.05)  # the loop is busy elsewhere for 50 ms
        t_busy_end = time.perf_counter_ns()
        await fut
        server.close()
        listener.close()
        proto.abort()
        return t_sent, t_busy_end, sink

    t_sent, t_busy_end, sink = asyncio.run(go())
    assert sink.status == 200 and sink.reads
    assert sink.reads[0] < t_busy_end - 40_000_000  # not the (late) read time
    assert abs(sink.reads[0] - t_sent) < 5_000_000  # the arrival, within a few ms


def test_credentials_in_the_url_become_basic_auth_on_streams() -> None:
    async def go(url: str) -> RawStream:
        body = json.dumps({"model": "m", "prompt": "a", "max_tokens": 2, "stream": True}).encode()
        async with Client(url, timeout_s=30) as client:
            return await client.stream("/v1/completions", body)

    with SSEServer(Plan(itl_s=0.001)) as srv:
        raw = asyncio.run(go(srv.url.replace("http://", "http://u%40x:p@")))
        sent = srv.headers[-1]
    assert raw.error_kind is None
    assert sent["Authorization"] == "Basic dUB4OnA="  # base64 of "u@x:p"
