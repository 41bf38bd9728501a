"""TCP ports of engine servers: in use, free, valid."""

from __future__ import annotations

import socket

from ceiling.errors import CeilingError


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_in_use(host: str, port: int) -> bool:
    """True when something accepts connections on ``host:port`` or a server could not bind it."""
    host = host or "127.0.0.1"
    probe = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    with socket.socket(_family(probe), socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        if s.connect_ex((probe, port)) == 0:
            return True
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        # SO_REUSEADDR as servers set it: connections left in TIME_WAIT do not block a restart
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (there is a small race; launch re-checks)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port(port: int | None, option: str = "--port") -> None:
    """A TCP port number, or a one-line error naming ``option``."""
    if port is not None and not 1 <= port <= 65535:
        raise CeilingError(
            f"{option} {port} is not a TCP port", fix=f"pass {option} between 1 and 65535"
        )
