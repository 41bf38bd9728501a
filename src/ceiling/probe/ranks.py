"""Start one fresh process per rank (torch.distributed's env:// rendezvous) and wait for them.

Fresh processes per run are the point: NCCL reads its ``NCCL_*`` environment once, at
communicator creation, so a variant can only be tried in new processes. Every process gets the
always-on safety settings (NVLink multicast off) whatever the caller's environment says.

A multi-rank run fails in two ways that look alike from outside: a rank dies (an exception, an
out-of-memory, a signal) and its peers wait forever in their next collective, or every rank
hangs. Either way the caller gets a record, never silence: per rank its exit code (or that it
was still running), the last stage it announced (:mod:`ceiling.probe.rankstage`), and its last
words, which for a rank stopped by us include every thread's Python stack (``SIGUSR1`` ->
faulthandler). When one rank has failed, the others get ``peer_grace_s`` to finish before they
are stopped: they are almost certainly blocked on the dead one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from ceiling.console import say
from ceiling.errors import CeilingError
from ceiling.outputs import write_atomic
from ceiling.probe.rankstage import DUMP_SIGNAL, PREFIX
from ceiling.run.guard import spawn_watchdog
from ceiling.spec._data import DataModel, load_yaml


class CommbenchFile(DataModel):
    """``data/commbench.yaml``: NCCL variants, groups of them, the environment every rank gets,
    reference hidden sizes (environment values are strings: they are set as they are)."""

    schema_version: int
    always_env: dict[str, str]
    variants: dict[str, dict[str, str]]
    groups: dict[str, list[str]]
    reference_hidden_sizes: dict[str, int]


#: variables of ours that reach the ranks although they start with NCCL_: they change what
#: NCCL prints, not what it does
PASS_THROUGH = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")
LAST_WORDS = 40


@cache
def always_env() -> dict[str, str]:
    """NVLink multicast off in every process we start (data/commbench.yaml, device README)."""
    return dict(load_yaml("commbench.yaml", schema=CommbenchFile).always_env)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RankRecord:
    """One rank's end: ``code`` None means it was still running when it was stopped."""

    rank: int
    code: int | None
    stage: str | None
    last_words: list[str] = field(default_factory=list)
    stopped: bool = False  # we stopped it (timeout, or its peer had failed)

    def summary(self) -> str:
        state = "still running" if self.code is None else f"exit {self.code}"
        if self.stopped:
            state += ", stopped"
        where = f" in stage '{self.stage}'" if self.stage else " before its first stage"
        said = _last_said(self.last_words)
        return f"rank{self.rank} {state}{where}" + (f": {said}" if said else "")

    def to_json(self) -> dict:
        return {
            "rank": self.rank,
            "exit_code": self.code,
            "stage": self.stage,
            "stopped": self.stopped,
            "last_words": self.last_words,
        }


@dataclass
class RanksOutcome:
    ranks: list[RankRecord]
    timed_out: bool
    waited_s: float = 0.0
    log_dir: str | None = None  # where the full rank logs were kept, if asked
    interrupted: bool = False

    @property
    def codes(self) -> list[int | None]:
        return [r.code for r in self.ranks]

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(r.code == 0 for r in self.ranks)

    @property
    def log_tail(self) -> list[str]:
        return [f"rank{r.rank}: {ln}" for r in self.ranks for ln in r.last_words[-6:]]

    def describe(self) -> str:
        if self.interrupted:
            why = f"interrupted after {self.waited_s:.0f} s"
        elif self.timed_out:
            why = f"timed out after {self.waited_s:.0f} s"
        else:
            why = f"exit codes {self.codes}"
        return f"ranks failed ({why}): " + " | ".join(r.summary() for r in self.ranks)

    def to_json(self) -> dict:
        return {
            "timed_out": self.timed_out,
            "interrupted": self.interrupted,
            "waited_s": round(self.waited_s, 1),
            "log_dir": self.log_dir,
            "ranks": [r.to_json() for r in self.ranks],
        }


def rank_env(rank: int, world: int, port: int, variant_env: dict[str, str]) -> dict[str, str]:
    """The environment of one rank: ours minus NCCL_* (debug output aside), plus the variant,
    the safety settings and the rendezvous variables; ``src/`` on PYTHONPATH so
    ``-m ceiling...`` works uninstalled."""
    src = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_") or k in PASS_THROUGH}
    env.update(variant_env)
    env.update(always_env())
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        PYTHONPATH=src + os.pathsep + env.get("PYTHONPATH", ""),
        PYTHONUNBUFFERED="1",
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _keep(paths: list[Path], folder: Path) -> str | None:
    """Copy the ranks' logs into ``folder`` (each complete or absent, an older log of the same
    name kept beside it). A copy that cannot be written is a note: the outcome, which the
    caller is waiting for, is not lost over a log."""
    try:
        for path in paths:
            if path.exists():
                write_atomic(folder / path.name, path.read_bytes(), what="rank log")
    except (CeilingError, OSError) as err:
        say(f"note: the rank logs were not all kept in {folder}: {err}")
        return None
    return str(folder)


def run_ranks(
    argv: list[str],
    world: int,
    variant_env: dict[str, str],
    timeout_s: float,
    on_line: Callable[[str], None] | None = None,
    *,
    peer_grace_s: float = 15.0,
    dump_wait_s: float = 3.0,
    keep_logs: Path | None = None,
) -> RanksOutcome:
    """Run ``argv`` once per rank; rank 0's stdout lines go to ``on_line`` (from a reader
    thread); each rank's stderr goes to its log. ``timeout_s`` bounds the whole run however
    quiet the ranks are. ``keep_logs``: a folder that receives ``rank<N>.log``."""
    port = free_port()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ceiling-ranks-") as tmp:
        paths = [Path(tmp, f"rank{r}.log") for r in range(world)]
        procs: list[subprocess.Popen] = []
        reader: threading.Thread | None = None
        timed_out = False
        stopped: set[int] = set()
        interrupted: KeyboardInterrupt | None = None
        watchdog: subprocess.Popen[bytes] | None = None
        try:
            for rank in range(world):
                with open(paths[rank], "w") as log:
                    procs.append(
                        subprocess.Popen(
                            argv,
                            env=rank_env(rank, world, port, variant_env),
                            stdout=subprocess.PIPE if rank == 0 else log,
                            stderr=log,
                            stdin=subprocess.DEVNULL,
                            text=True,
                            start_new_session=True,
                        )
                    )
            # the guard the engines have: the ranks die with us, even when we are SIGKILLed
            watchdog = spawn_watchdog([p.pid for p in procs])
            reader = threading.Thread(target=_pump, args=(procs[0].stdout, on_line), daemon=True)
            reader.start()
            deadline = t0 + timeout_s
            failed_at: float | None = None
            while True:
                codes = [p.poll() for p in procs]
                if all(c is not None for c in codes):
                    break
                now = time.monotonic()
                if failed_at is None and any(c not in (None, 0) for c in codes):
                    failed_at = now  # a rank died: its peers are blocked on it
                if now > deadline or (failed_at is not None and now > failed_at + peer_grace_s):
                    timed_out = now > deadline
                    stopped = {i for i, c in enumerate(codes) if c is None}
                    _stop(procs, stopped, dump_wait_s, paths)
                    break
                time.sleep(0.05)
        except KeyboardInterrupt as exc:
            # Ctrl-C, or SIGTERM turned into one by the caller: the ranks' stacks are the
            # record of where they were; the outcome travels on the exception
            interrupted = exc
            left = {i for i, p in enumerate(procs) if p.poll() is None}
            stopped |= left
            _stop(procs, left, min(dump_wait_s, 2.0), paths)
        finally:
            left = {i for i, p in enumerate(procs) if p.poll() is None}
            if left:  # an unexpected error: no rank outlives us
                stopped |= left
                _stop(procs, left, 0.0, paths)
            if reader is not None:
                reader.join(timeout=2.0)
            if watchdog is not None:
                with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                    watchdog.terminate()
                    watchdog.wait(timeout=5)
        waited = time.monotonic() - t0
        records = []
        for rank, p in enumerate(procs):
            text = paths[rank].read_text(errors="replace") if paths[rank].exists() else ""
            code = None if rank in stopped else p.returncode
            records.append(_record(rank, code, text, rank in stopped))
        kept = None
        if keep_logs is not None:
            kept = _keep(paths, keep_logs)
    outcome = RanksOutcome(
        ranks=records,
        timed_out=timed_out,
        waited_s=waited,
        log_dir=kept,
        interrupted=interrupted is not None,
    )
    if interrupted is not None:
        interrupted.ranks_outcome = outcome  # type: ignore[attr-defined]
        raise interrupted
    return outcome


def _pump(stream, on_line: Callable[[str], None] | None) -> None:
    if stream is None:
        return
    for line in stream:
        if on_line is not None:
            # a progress display must not kill the run's bookkeeping
            with contextlib.suppress(Exception):
                on_line(line.rstrip("\n"))


DUMP_SETTLE_S = 0.3  # a stack dump is written in one go: a log quiet this long after it grew


def _stop(
    procs: list[subprocess.Popen], which: set[int], dump_wait_s: float, logs: list[Path]
) -> None:
    """Ask each rank for its stacks (SIGUSR1 -> faulthandler), wait until every dump has
    landed in its log (the log grew, then stayed quiet), at most ``dump_wait_s``, then kill
    the rank's whole process group (it started its own session)."""
    if dump_wait_s > 0:
        size = {i: _size(logs[i]) for i in which}
        for i in which:
            _signal_group(procs[i], DUMP_SIGNAL)
        end = time.monotonic() + dump_wait_s
        quiet_since = {i: time.monotonic() for i in which}
        while time.monotonic() < end:
            now = time.monotonic()
            waiting = False
            for i in which:
                if procs[i].poll() is not None:
                    continue
                grown = _size(logs[i])
                if grown != size[i]:
                    size[i], quiet_since[i] = grown, now
                    waiting = True
                elif grown == 0 or now - quiet_since[i] < DUMP_SETTLE_S or not _dumped(logs[i]):
                    waiting = True
            if not waiting:
                break
            time.sleep(0.05)
    for i in which:
        _signal_group(procs[i], signal.SIGKILL)
    for i in which:
        with contextlib.suppress(subprocess.TimeoutExpired):
            procs[i].wait(timeout=10)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _dumped(path: Path) -> bool:
    """Whether the log holds a stack dump (faulthandler's header) after the last stage line."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return False
    tail = text.rsplit(PREFIX, 1)[-1]
    return "(most recent call first)" in tail


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    if p.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)  # the group is the rank's own (start_new_session)


def _record(rank: int, code: int | None, text: str, stopped: bool) -> RankRecord:
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    stage = None
    for ln in lines:
        if ln.startswith(PREFIX):
            stage = ln[len(PREFIX) :].split(" t=")[0]
    return RankRecord(
        rank=rank, code=code, stage=stage, last_words=lines[-LAST_WORDS:], stopped=stopped
    )


def _last_said(lines: list[str]) -> str:
    """The line that explains the end best: an exception or error line, else the frame the
    rank was stopped in (the first 'File' line of a stack dump's current thread), else the
    last line."""
    for ln in reversed(lines):
        s = ln.strip()
        if s.startswith(PREFIX):
            continue
        if ("Error" in s or "error" in s or "Exception" in s) and not s.startswith("File "):
            return s[:240]
    for i, ln in enumerate(lines):
        if ln.startswith("Current thread") and "most recent call first" in ln:
            frames = []
            for f in lines[i + 1 :]:
                if not f.strip().startswith("File "):
                    break
                frames.append(f.strip())
            # the innermost frame, and the innermost one of the caller's own code
            own = [f for f in frames if "site-packages" not in f and "/lib/python" not in f]
            pick = frames[:1] + [f for f in own[:1] if f not in frames[:1]]
            if pick:
                return " <- ".join(pick)[:300]
    tail = [ln for ln in lines if not ln.startswith(PREFIX)]
    return tail[-1][:240] if tail else ""
