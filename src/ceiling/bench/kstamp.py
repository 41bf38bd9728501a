"""Kernel receive timestamps for the streaming path: a socket read with ``recvmsg``.

A stamp taken in user space is as late as the event loop is busy. Linux stamps every received
segment (``SO_TIMESTAMPNS``) and hands the stamp of the read's last segment to ``recvmsg`` as
ancillary data: the moment the bytes reached this host, whatever the loop was doing. This
module reads plain TCP sockets itself to get that stamp and feeds each read, stamped, to the
HTTP protocol of :mod:`ceiling.bench.http` (TLS keeps asyncio's transport and the read time).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import time
from typing import Any, Protocol


class Reader(Protocol):
    """What the socket's reads go to (``ceiling.bench.http.StreamProtocol``)."""

    def feed(self, data: bytes, t: int) -> None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...


_perf_ns = time.perf_counter_ns
#: Linux socket option (and control message type) for receive timestamps in nanoseconds.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SCM_TIMESTAMPNS = getattr(socket, "SCM_TIMESTAMPNS", SO_TIMESTAMPNS)
_TIMESPEC = struct.Struct("@qq")
#: A kernel stamp older than this (s) at read time is not believed (clock step).
MAX_KERNEL_AGE_NS = 600 * 1_000_000_000
#: Bytes asked for per read (below glibc's mmap threshold: no mmap/munmap per read).
READ_SIZE = 65536


class KernelStampedSocket:
    """Transport-like wrapper of a plain TCP socket that this module reads itself, with
    ``recvmsg``, to get the kernel's receive timestamp of each read (``SO_TIMESTAMPNS``: the
    time the read's last segment reached the host). A stamp taken in user space is as late as
    the event loop is busy; the kernel's is not, as long as a stream's chunks do not pile up
    in its socket between two reads (then the earlier ones get the last one's time, which is
    still no later than the read). The kernel gives CLOCK_REALTIME: it is moved onto the
    monotonic clock with the two clocks' difference read at the same moment, per read.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        proto: Reader,
        misses: list[int] | None = None,
    ) -> None:
        self._loop, self._sock, self._proto = loop, sock, proto
        self._misses = misses if misses is not None else [0]
        self._fd = sock.fileno()
        self._out = b""
        self._closing = False
        loop.add_reader(self._fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            data, anc, _flags, _addr = self._sock.recvmsg(READ_SIZE, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            self._lost(err)
            return
        t = _perf_ns()
        real = time.time_ns()  # right after: the two clocks' difference at this instant
        if not data:
            self._lost(None)
            return
        if anc:
            _lvl, typ, cdata = anc[-1]
            if typ == SCM_TIMESTAMPNS and len(cdata) >= 16:
                sec, nsec = _TIMESPEC.unpack_from(cdata)
                k = sec * 1_000_000_000 + nsec - real + t
                # A clock step between arrival and now would give nonsense: keep the read time.
                if t - MAX_KERNEL_AGE_NS < k <= t:
                    self._proto.feed(data, k)
                    return
        self._misses[0] += 1  # no usable kernel stamp: the read time it is
        self._proto.feed(data, t)

    def write(self, data: bytes) -> None:
        if self._closing:
            return
        if not self._out:
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as err:
                self._lost(err)
                return
            data = data[sent:]
            if not data:
                return
            self._loop.add_writer(self._fd, self._flush)
        self._out += data

    def _flush(self) -> None:
        try:
            sent = self._sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            self._lost(err)
            return
        self._out = self._out[sent:]
        if not self._out:
            self._loop.remove_writer(self._fd)

    def _lost(self, err: Exception | None) -> None:
        if not self._closing:
            self.abort()
            self._proto.connection_lost(err)

    def abort(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        if self._out:
            self._loop.remove_writer(self._fd)
        self._sock.close()
        self._loop.call_soon(self._proto.connection_lost, None)

    close = abort

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._sock if name == "socket" else default


def kernel_stamps_supported() -> bool:
    """Whether this platform hands out receive timestamps on TCP sockets (Linux does)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True
