"""``ceiling ready``: wait until a server's health endpoints answer 200 (a unit's
``ExecStartPost``: the service is "activating" until then, and ``systemctl start`` waits)."""

from __future__ import annotations

import os
import time

from pydantic import BaseModel

from ceiling.errors import CeilingError, ExitStatus
from ceiling.inputs import check_server_url
from ceiling.server.sync import SyncClient


def _ok(client: SyncClient, path: str) -> bool:
    return client.health(path, timeout_s=2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_ready(
    url: str, paths: list[str], timeout_s: float, pid: int | None = None, interval_s: float = 0.5
) -> float:
    """Seconds until every ``url + path`` answered 200; CeilingError on timeout or when ``pid``
    (the server's main process) is gone first."""
    t0 = time.monotonic()
    # URL, credentials and proxy by the one policy (ceiling.server.policy): a unit's own
    # server is on loopback and never goes through a proxy; a remote one honours NO_PROXY.
    client = SyncClient(url)
    base = client.base
    while True:
        if all(_ok(client, p) for p in paths):
            return time.monotonic() - t0
        if pid is not None and not _alive(pid):
            raise CeilingError(
                f"the server process {pid} exited before {base} was ready",
                fix="read its log (journalctl -u UNIT)",
                exit_code=ExitStatus.ENGINE,
            )
        if time.monotonic() - t0 > timeout_s:
            raise CeilingError(
                f"{base} not ready after {timeout_s:.0f} s ({', '.join(paths)})",
                fix="raise --ready-timeout (large models load for many minutes) or read the log",
                exit_code=ExitStatus.SERVER,
            )
        time.sleep(interval_s)


class Ready(BaseModel):
    """``ceiling ready``: the server answered 200 on every path after ``ready_s`` seconds."""

    url: str
    paths: list[str]
    ready_s: float


def check_ready_inputs(url: str, paths: list[str], timeout_s: float, pid: int | None) -> None:
    """Every input of ``ceiling ready`` checked before the first request (one line each)."""
    check_server_url(url)
    for path in paths:
        if not path.startswith("/") or any(c.isspace() or ord(c) < 32 for c in path):
            raise CeilingError(
                f"--path {path!r} is not a URL path", fix="e.g. --path /health (starts with /)"
            )
    if not 0 < timeout_s <= 7 * 86400:  # a week: longer is a typo
        raise CeilingError(
            f"--ready-timeout {timeout_s:g} is not a positive time", fix="--ready-timeout 600"
        )
    if pid is not None and pid < 1:
        raise CeilingError(f"--pid {pid} is not a process id", fix="the server's main PID")


def ready(url: str, paths: list[str], timeout_s: float, pid: int | None) -> Ready:
    """``ceiling ready``: wait for ``paths`` (default ``/health``) of ``url``."""
    check_ready_inputs(url, paths, timeout_s, pid)
    took = wait_ready(url, paths or ["/health"], timeout_s, pid)
    return Ready(url=url, paths=paths, ready_s=round(took, 2))
