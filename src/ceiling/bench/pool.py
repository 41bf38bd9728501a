"""The pool of keep-alive connections the streaming path sends on (:mod:`ceiling.bench.http`).

Connections open on demand without a limit (one per concurrent stream) or ahead of a level
(:meth:`StreamPool.prewarm`), are reused while fresh, and are read by this process itself with
kernel receive timestamps on plain TCP on Linux (:mod:`ceiling.bench.kstamp`), else by asyncio's
transport (TLS, other platforms).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from urllib.parse import urlsplit

from ceiling.bench.http import StreamProtocol
from ceiling.bench.kstamp import SO_TIMESTAMPNS, KernelStampedSocket, kernel_stamps_supported
from ceiling.server.policy import Target, basic_auth

#: A pooled connection idle longer than this is not reused (uvicorn closes idle ones after 5 s;
#: a fresh connection costs far less than a request lost to that race).
IDLE_REUSE_S = 2.0


class StreamPool:
    """Keep-alive connections to one server, opened on demand (no limit), reused when idle."""

    def __init__(self, tgt: Target, headers: dict[str, str], connect_timeout_s: float) -> None:
        parts = urlsplit(tgt.base)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        default_port = 443 if self.https else 80
        host_hdr = f"[{self.host}]" if ":" in self.host else self.host
        if self.port != default_port:
            host_hdr += f":{self.port}"
        lines = [f"Host: {host_hdr}", "Accept-Encoding: identity", "Connection: keep-alive"]
        lines += [f"{k}: {v}" for k, v in {**headers, **tgt.headers}.items()]
        #: The proxy the policy chose (None: direct). Plain http goes to it with the
        #: absolute URL in the request line; https through a CONNECT tunnel (:meth:`_tunnel`).
        self.proxy = urlsplit(tgt.proxy) if tgt.proxy else None
        self._target_prefix = b""
        if self.proxy is not None:
            if self.proxy.username is not None:
                lines.append(
                    "Proxy-Authorization: " + basic_auth(self.proxy.netloc.rsplit("@", 1)[0])
                )
            if not self.https:
                self._target_prefix = f"http://{host_hdr}".encode("latin-1")
        self._proxy_auth = [ln for ln in lines if ln.startswith("Proxy-Authorization")]
        self._headers = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self.connect_timeout_s = connect_timeout_s
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if self.https else None
        #: "kernel": reads stamped by the kernel (plain TCP on Linux); "socket": stamped when
        #: the event loop hands the bytes over (TLS, other platforms).
        self.timestamp_source = (
            "socket" if self.https or not kernel_stamps_supported() else "kernel"
        )
        #: Reads that came without a kernel stamp (and got the read time instead).
        self.kernel_misses = [0]
        self._keeper: socket.socket | None = None
        if self.timestamp_source == "kernel":
            # Linux switches receive timestamping on for the whole host when the first socket
            # asks, a few ms later (a deferred static key), and off when the last one closes:
            # one socket that asks and stays open keeps it on from now until close().
            self._keeper = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._keeper.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self._addrs: list[tuple[int, tuple[object, ...]]] | None = None
        self._idle: list[StreamProtocol] = []
        self._all: set[StreamProtocol] = set()

    def request_bytes(self, path: str, body: bytes, content_type: str) -> bytes:
        return (
            b"POST %s%s HTTP/1.1\r\n%sContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
            % (
                self._target_prefix,
                path.encode("latin-1"),
                self._headers,
                content_type.encode("latin-1"),
                len(body),
            )
            + body
        )

    async def _resolve(self) -> list[tuple[int, tuple[object, ...]]]:
        if self._addrs is None:
            loop = asyncio.get_running_loop()
            # Through a proxy the connection goes to the proxy (the server's name is the
            # proxy's to resolve, as curl does).
            host, port = self.host, self.port
            if self.proxy is not None:
                host, port = self.proxy.hostname or "127.0.0.1", self.proxy.port or 80
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            self._addrs = [(fam, addr) for fam, _t, _p, _c, addr in infos]
        return self._addrs

    async def _open(self) -> StreamProtocol:
        loop = asyncio.get_running_loop()
        last: OSError | None = None
        for family, addr in await self._resolve():
            if self.timestamp_source == "kernel":
                try:
                    async with asyncio.timeout(self.connect_timeout_s):
                        proto = await self._open_kernel_stamped(family, addr)
                except OSError as err:
                    last = err
                    continue
                self._all.add(proto)
                return proto
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    if self.proxy is not None and self.https:
                        sock = await self._tunnel(family, addr)
                        _tr, proto = await loop.create_connection(
                            StreamProtocol, sock=sock, ssl=self._ssl, server_hostname=self.host
                        )
                    else:
                        _tr, proto = await loop.create_connection(
                            StreamProtocol,
                            host=str(addr[0]),
                            port=int(str(addr[1])),
                            family=family,
                            ssl=self._ssl,
                            server_hostname=self.host if self._ssl else None,
                        )
            except OSError as err:
                last = err
                continue
            self._all.add(proto)
            return proto
        raise last or OSError(f"cannot connect to {self.host}:{self.port}")

    async def _tunnel(self, family: int, addr: tuple[object, ...]) -> socket.socket:
        """A socket to the proxy at ``addr`` with a CONNECT tunnel to the server open on it
        (TLS then runs inside, end to end with the server)."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, addr)
            hostport = (
                f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
            )
            head = "".join(f"{h}\r\n" for h in self._proxy_auth)
            req = f"CONNECT {hostport} HTTP/1.1\r\nHost: {hostport}\r\n{head}\r\n"
            await loop.sock_sendall(sock, req.encode("latin-1"))
            answer = b""
            while b"\r\n\r\n" not in answer:  # the proxy's answer head; nothing follows it
                chunk = await loop.sock_recv(sock, 4096)
                if not chunk or len(answer) > 65536:
                    raise OSError(f"the proxy closed the tunnel to {hostport}")
                answer += chunk
            status = answer.split(b"\r\n", 1)[0].split()
            if len(status) < 2 or status[1] != b"200":
                raise OSError(f"the proxy refused a tunnel to {hostport}: {answer[:80]!r}")
        except BaseException:
            sock.close()
            raise
        return sock

    async def _open_kernel_stamped(self, family: int, addr: tuple[object, ...]) -> StreamProtocol:
        loop = asyncio.get_running_loop()
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            await loop.sock_connect(sock, addr)
        except BaseException:
            sock.close()
            raise
        proto = StreamProtocol()
        io = KernelStampedSocket(loop, sock, proto, self.kernel_misses)
        proto.connection_made(io)  # type: ignore[arg-type]
        return proto

    async def acquire(self) -> tuple[StreamProtocol, bool]:
        """A connection (reused when a fresh idle one exists) and whether it was reused."""
        now = time.monotonic()
        while self._idle:
            proto = self._idle.pop()
            if not proto.closed and now - proto.idle_since < IDLE_REUSE_S:
                return proto, True
            self._drop(proto)
        return await self._open(), False

    async def prewarm(self, n: int) -> None:
        """Open connections (concurrently) until ``n`` fresh idle ones are in the pool."""
        now = time.monotonic()
        fresh: list[StreamProtocol] = []
        stale: list[StreamProtocol] = []
        for proto in self._idle:
            ok = not proto.closed and now - proto.idle_since < IDLE_REUSE_S
            (fresh if ok else stale).append(proto)
        for proto in stale:
            self._drop(proto)
        self._idle = fresh
        missing = n - len(fresh)
        if missing <= 0:
            return
        opened = await asyncio.gather(
            *(self._open() for _ in range(missing)), return_exceptions=True
        )
        now = time.monotonic()
        for item in opened:
            if isinstance(item, StreamProtocol):
                item.reusable, item.idle_since = True, now
                self._idle.append(item)

    def release(self, proto: StreamProtocol) -> None:
        if proto.reusable and not proto.closed:
            proto.sink, proto.done = None, None
            proto.idle_since = time.monotonic()
            self._idle.append(proto)
        else:
            self._drop(proto)

    def _drop(self, proto: StreamProtocol) -> None:
        proto.abort()
        self._all.discard(proto)

    def close(self) -> None:
        for proto in list(self._all):
            proto.abort()
        self._all.clear()
        self._idle.clear()
        if self._keeper is not None:
            self._keeper.close()
            self._keeper = None
