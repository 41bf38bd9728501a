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

A group is only ever signalled while it is ours: its id is a PID that is also the session id of
every member (we started it with ``start_new_session``), and a record's leader start time must
match when the leader is still there (a recycled PID is never signalled). Processes are read
with psutil (its (PID, creation time) is a process's identity, as psutil itself uses it); the
group and session ids with ``os.getpgid``/``os.getsid`` (psutil has neither).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil
from pydantic import BaseModel, Field, model_validator

from ceiling.errors import CeilingError, ExitStatus

SCHEMA_VERSION = 2  # 2: start times are psutil's creation times (seconds since the epoch)
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
    started: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @model_validator(mode="before")
    @classmethod
    def _clock_ticks_unknown(cls, data: object) -> object:
        """A schema-1 record (an older ceiling) kept start times in clock ticks since boot:
        not comparable, so unknown (the group/session check still guards the PID)."""
        if isinstance(data, dict) and data.get("schema_version", 1) < 2:
            return {**data, "leader_start": None, "owner_start": None}
        return data

    @property
    def path(self) -> Path:
        return state_dir() / f"{self.pid}.json"

    def owner_alive(self) -> bool:
        st = start_time(self.owner_pid)
        return st is not None and (self.owner_start is None or st == self.owner_start)

    def members(self) -> list[int]:
        """The group's live processes; none when the leader PID now belongs to someone else."""
        leader = start_time(self.pid)
        if leader is not None and self.leader_start is not None and leader != self.leader_start:
            return []
        return group_members(self.pid)


def write_record(rec: ServerRecord) -> None:
    """Save ``rec`` (best effort: a read-only home must not stop a launch)."""
    with contextlib.suppress(OSError):
        rec.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = rec.path.with_suffix(".tmp")
        tmp.write_text(rec.model_dump_json(indent=2) + "\n")
        tmp.replace(rec.path)


def remove_record(pid: int) -> None:
    with contextlib.suppress(OSError):
        (state_dir() / f"{pid}.json").unlink()


def records() -> list[ServerRecord]:
    """Records of servers that still have processes; records of finished ones are removed."""
    out: list[ServerRecord] = []
    d = state_dir()
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.json")):
        try:
            rec = ServerRecord.model_validate(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
        if rec.members():
            out.append(rec)
        else:
            with contextlib.suppress(OSError):
                p.unlink()
    return out


def orphans() -> list[ServerRecord]:
    """Servers whose ceiling process is gone but whose processes still run."""
    return [r for r in records() if not r.owner_alive()]


def spawn_watchdog(pgid: int) -> subprocess.Popen[bytes] | None:
    """Start the watchdog of group ``pgid`` for this process (None when it cannot start)."""
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "ceiling.run.watchdog", str(pgid), str(os.getpid())],
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


def stop_servers(all_servers: bool = False, grace_s: float = KILL_GRACE_S) -> list[Stopped]:
    """End orphaned servers (``all_servers``: also those whose ceiling still runs)."""
    done: list[Stopped] = []
    for rec in records():
        if rec.owner_alive() and not all_servers:
            continue
        if not rec.members():
            continue
        signals = end_group(rec.pid, grace_s)
        left = rec.members()
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
    return done


class StopReport(BaseModel):
    """``ceiling stop``: the servers it ended, and those left running (their ceiling lives)."""

    stopped: list[Stopped]
    left_running: list[ServerRecord]

    def check(self) -> None:
        """CeilingError (exit 1) when a stopped server left processes behind."""
        if any(d.leftover_pids for d in self.stopped):
            raise CeilingError(
                "some engine processes survived SIGKILL",
                fix="check them with ps; they may belong to another user",
                exit_code=ExitStatus.FAILED,
            )


def stop_orphans(all_servers: bool = False) -> StopReport:
    """``ceiling stop``: end engine servers whose ceiling is gone (``all_servers``: every
    recorded one); CeilingError (exit 1) when some process survived SIGKILL."""
    running = [r for r in records() if r.owner_alive()]
    done = stop_servers(all_servers=all_servers)
    return StopReport(stopped=done, left_running=[] if all_servers else running)
