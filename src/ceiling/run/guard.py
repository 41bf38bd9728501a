"""An engine never outlives the ceiling that started it, silently.

Two guards, because one can fail:

1. **A watchdog process** (:mod:`ceiling.run.watchdog`), started beside every engine, in its own
   session (terminal signals do not reach it). It waits on the ceiling process (a pidfd, so it
   wakes the instant ceiling dies, even by SIGKILL) and then ends the engine's whole process group:
   SIGTERM, SIGKILL after a short grace. ``PR_SET_PDEATHSIG`` in the engine alone would not do:
   it reaches only the process ceiling started, and a SIGKILLed vLLM API server leaves its
   EngineCore and workers running (measured with vLLM 0.32 on CPU; tests/engine/).
2. **A record** per launched server (pid = process group, port, log, owner pid and start times)
   under :func:`state_dir`. ``ceiling stop`` ends the servers whose ceiling is gone (the watchdog
   was killed too, e.g. ``kill -9 -1`` or the OOM killer), ``ceiling shm`` names them.

A group is only ever signalled while ceiling can prove it is ours (:meth:`ServerRecord.identify`):
its id is a PID that is also the session id of every member (we started it with
``start_new_session``), and either the leader is alive with exactly the start time the record
holds, or (the leader died, its engine core lives on) every member carries the record's token
in its environment (``CEILING_SERVER_TOKEN``, set at launch and inherited by every child). A
record without a known start time (an older ceiling's, a hand-written one) or a group whose
members do not carry the token is never signalled: ``ceiling stop`` names it and the command a
user would run after checking it. Processes are read with psutil (its (PID, creation time) is a
process's identity, as psutil itself uses it); the group and session ids with
``os.getpgid``/``os.getsid`` (psutil has neither).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil
from pydantic import BaseModel, Field

from ceiling.errors import CeilingError, ExitStatus
from ceiling.inputs import read_json
from ceiling.outputs import write_atomic

# 2: start times are psutil's creation times (seconds since the epoch); 3: the group's token
SCHEMA_VERSION = 3
#: The environment variable every process of a launched engine inherits: its record's token.
TOKEN_ENV = "CEILING_SERVER_TOKEN"
#: Seconds between SIGTERM and SIGKILL when the watchdog or ``ceiling stop`` ends a group.
KILL_GRACE_S = 5.0


def state_dir() -> Path:
    """Where server records live: ``$CEILING_STATE_DIR``, else ``$XDG_STATE_HOME/ceiling/servers``
    (``~/.local/state/ceiling/servers``)."""
    if os.environ.get("CEILING_STATE_DIR"):
        return Path(os.environ["CEILING_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "ceiling" / "servers"


def start_time(pid: int) -> float | None:
    """The process's creation time (psutil): with the PID, its identity."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, ValueError):
        return None


def group_members(pgid: int) -> list[int]:
    """Live PIDs whose process group AND session are ``pgid`` (the session we created);
    zombies (exited, not yet reaped) are not members."""
    members = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) != pgid or os.getsid(pid) != pgid:
                continue
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                continue
        except (OSError, psutil.Error):  # gone meanwhile
            continue
        members.append(pid)
    return members


def end_group(pgid: int, grace_s: float = KILL_GRACE_S) -> list[str]:
    """SIGTERM the group, SIGKILL what is left after ``grace_s``; returns the signals sent."""
    sent: list[str] = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not group_members(pgid):
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
            sent.append(sig.name)
        end = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while group_members(pgid) and time.monotonic() < end:
            time.sleep(0.1)
    return sent


class ServerRecord(BaseModel):
    """One engine server a ceiling process started (``state_dir()/<pid>.json``)."""

    schema_version: int = SCHEMA_VERSION
    pid: int = Field(description="the engine's first process = its process group and session")
    leader_start: float | None = None
    port: int
    host: str
    variant: str
    engine: str
    log_path: str
    owner_pid: int
    owner_start: float | None = None
    watchdog_pid: int | None = None
    token: str | None = Field(None, description=f"the value of {TOKEN_ENV} in the engine's env")
    started: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @property
    def path(self) -> Path:
        return state_dir() / f"{self.pid}.json"

    def owner_alive(self) -> bool:
        st = start_time(self.owner_pid)
        return st is not None and (self.owner_start is None or st == self.owner_start)

    def identify(self) -> tuple[str, list[int], str]:
        """(state, members, why): ``ours`` (``members`` may be signalled), ``gone`` (nothing
        of it runs; the record may go), or ``unproven`` (processes run under the PID but
        nothing proves they are the engine ceiling started: never signalled)."""
        leader = start_time(self.pid)
        if leader is not None and self.leader_start is not None and leader != self.leader_start:
            return "gone", [], "the PID now belongs to a process started later"
        pids = group_members(self.pid)
        if not pids and leader is None:
            return "gone", [], "no process left"
        if not pids:  # the PID lives, but not as a session leader: reused
            return "gone", [], "the PID now belongs to another process"
        if leader is not None:
            if self.leader_start is None:
                return "unproven", pids, "the record holds no start time for the leader"
            return "ours", pids, ""
        # The leader died, members live on (vLLM's EngineCore after its API server): the PID
        # cannot have been reused while they keep it as their group, but a group that came and
        # went meanwhile could hold it now. Only the token in their environment proves them.
        if not self.token:
            return "unproven", pids, "the leader is gone and the record holds no token"
        if not all(_has_token(pid, self.token) for pid in pids):
            return "unproven", pids, f"not every process of group {self.pid} carries its token"
        return "ours", pids, ""

    def members(self) -> list[int]:
        """The group's live processes when they are provably ours; else none."""
        state, pids, _ = self.identify()
        return pids if state == "ours" else []

    def manual_stop(self) -> str:
        """What a user runs instead, after checking the processes are the engine."""
        return (
            f"check `ps -o pid,lstart,args -s {self.pid}`; if it is {self.variant}'s engine: "
            f"`kill -TERM -- -{self.pid}`, then `rm {self.path}`"
        )


def _has_token(pid: int, token: str) -> bool:
    try:
        return bool(psutil.Process(pid).environ().get(TOKEN_ENV) == token)
    except (psutil.Error, OSError):  # another user's process, or gone: not provably ours
        return False


def new_token() -> str:
    return secrets.token_hex(16)


def write_record(rec: ServerRecord) -> None:
    """Save ``rec`` (best effort: a read-only home must not stop a launch)."""
    with contextlib.suppress(OSError, CeilingError):
        rec.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(
            rec.path,
            rec.model_dump_json(indent=2) + "\n",
            mode=0o600,
            what="server record",
            keep_previous=False,
        )


def remove_record(pid: int, token: str | None = None) -> None:
    """Remove ``pid``'s record (``token``: only when the record is that server's)."""
    path = state_dir() / f"{pid}.json"
    if token is not None:
        rec = _load(path)
        if rec is None or rec.token != token:
            return
    with contextlib.suppress(OSError):
        path.unlink()


def _load(path: Path) -> ServerRecord | None:
    try:
        data = read_json(path, "server record", fix="")
        if isinstance(data, dict) and not _known_times(data.get("schema_version")):
            # a schema-1 record (an older ceiling), or one without a version, kept start times
            # in clock ticks since boot: not comparable, so unknown (never signalled)
            data = {**data, "leader_start": None, "owner_start": None}
        return ServerRecord.model_validate(data)
    except (CeilingError, ValueError):
        return None


def _known_times(version: object) -> bool:
    return isinstance(version, int) and not isinstance(version, bool) and version >= 2


def all_records() -> list[tuple[ServerRecord, str, list[int], str]]:
    """Every record with (state, members, why) of :meth:`ServerRecord.identify`; records of
    servers that are gone are removed."""
    out: list[tuple[ServerRecord, str, list[int], str]] = []
    d = state_dir()
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.json")):
        rec = _load(p)
        if rec is None:
            continue
        state, pids, why = rec.identify()
        if state == "gone":
            with contextlib.suppress(OSError):
                p.unlink()
            continue
        out.append((rec, state, pids, why))
    return out


def records() -> list[ServerRecord]:
    """Records of servers whose processes are provably still running."""
    return [rec for rec, state, _, _ in all_records() if state == "ours"]


def orphans() -> list[ServerRecord]:
    """Servers whose ceiling process is gone but whose processes still run."""
    return [r for r in records() if not r.owner_alive()]


def spawn_watchdog(
    pgid: int | list[int], token: str | None = None
) -> subprocess.Popen[bytes] | None:
    """Start the watchdog of group ``pgid`` (or of several: commbench's ranks) for this
    process (None when it cannot start)."""
    groups = ",".join(str(g) for g in ([pgid] if isinstance(pgid, int) else pgid))
    argv = [sys.executable, "-m", "ceiling.run.watchdog", groups, str(os.getpid())]
    try:
        return subprocess.Popen(
            [*argv, *([token] if token else [])],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except OSError:
        return None


class Stopped(BaseModel):
    """One server ``ceiling stop`` ended (or tried to)."""

    pid: int
    variant: str
    port: int
    owner_alive: bool
    signals: list[str]
    leftover_pids: list[int]


class Refused(BaseModel):
    """A record ``ceiling stop`` did not act on: processes run under its PID, but nothing
    proves they are the engine ceiling started."""

    pid: int
    variant: str
    pids: list[int]
    why: str
    instead: str = Field(description="what a user runs, after checking")


def stop_servers(
    all_servers: bool = False, grace_s: float = KILL_GRACE_S
) -> tuple[list[Stopped], list[Refused]]:
    """End orphaned servers (``all_servers``: also those whose ceiling still runs); records
    that cannot be proved ours are refused, never signalled."""
    done: list[Stopped] = []
    refused: list[Refused] = []
    for rec, state, pids, why in all_records():
        if rec.owner_alive() and not all_servers:
            continue
        if state != "ours":
            refused.append(
                Refused(
                    pid=rec.pid, variant=rec.variant, pids=pids, why=why, instead=rec.manual_stop()
                )
            )
            continue
        signals = end_group(rec.pid, grace_s)
        # proved ours before the first signal: what is left in the group is still ours (its
        # id cannot be reused while members keep it), even once the leader is gone
        left = group_members(rec.pid)
        if not left:
            remove_record(rec.pid)
        done.append(
            Stopped(
                pid=rec.pid,
                variant=rec.variant,
                port=rec.port,
                owner_alive=rec.owner_alive(),
                signals=signals,
                leftover_pids=left,
            )
        )
    return done, refused


class StopReport(BaseModel):
    """``ceiling stop``: the servers it ended, those left running (their ceiling lives), and
    those it refused to touch (not provably ours)."""

    stopped: list[Stopped]
    left_running: list[ServerRecord]
    refused: list[Refused] = Field(default_factory=list)

    def check(self) -> None:
        """CeilingError (exit 1) when a stopped server left processes behind or a record was
        refused (the user has a server to check by hand)."""
        if any(d.leftover_pids for d in self.stopped):
            raise CeilingError(
                "some engine processes survived SIGKILL",
                fix="check them with ps; they may belong to another user",
                exit_code=ExitStatus.FAILED,
            )
        if self.refused:
            first = self.refused[0]
            raise CeilingError(
                f"not signalled: pid {first.pid} ({first.variant}): {first.why}"
                + (f" (and {len(self.refused) - 1} more)" if len(self.refused) > 1 else ""),
                fix=first.instead,
                exit_code=ExitStatus.FAILED,
            )


def stop_orphans(all_servers: bool = False) -> StopReport:
    """``ceiling stop``: end engine servers whose ceiling is gone (``all_servers``: every
    recorded one); CeilingError (exit 1) when some process survived SIGKILL."""
    running = [r for r in records() if r.owner_alive()]
    done, refused = stop_servers(all_servers=all_servers)
    return StopReport(stopped=done, left_running=[] if all_servers else running, refused=refused)
