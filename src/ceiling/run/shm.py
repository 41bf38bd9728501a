"""/dev/shm hygiene: find the segments engines and NCCL leave behind, remove only unused ones.

A crashed vLLM/SGLang/NCCL run leaves shared-memory segments (``psm_*``, ``nccl-*``, ``vllm_*``,
``torch_*``, POSIX semaphores ``sem.*``, ...) that fill a small container /dev/shm and make the
next launch die with a bus error. The usual ritual (``rm -f /dev/shm/...``) also deletes the
segments of a server that is still running. Here a segment is removed only when no live process
has it open (``/proc/*/fd``) or mapped (``/proc/*/maps``); the default is a dry run.
"""

from __future__ import annotations

import fnmatch
import os
import time
from pathlib import Path

from pydantic import BaseModel, Field

SCHEMA_VERSION = 1
# Name patterns of segments created by inference engines, NCCL, PyTorch and Python's
# multiprocessing (fnmatch syntax).
PATTERNS = (
    "psm_*",
    "nccl-*",
    "nccl_*",
    "vllm*",
    "torch_*",
    "sem.mp-*",
    "mp-*",
    "wnsm_*",
    "sglang*",
    "__KMP_REGISTERED_LIB_*",
)


class Segment(BaseModel):
    """One file in /dev/shm that matches an engine pattern."""

    path: str
    size_bytes: int
    age_s: float
    pattern: str
    in_use_by: list[int] = Field(default_factory=list)

    @property
    def stale(self) -> bool:
        return not self.in_use_by


class ShmReport(BaseModel):
    schema_version: int = SCHEMA_VERSION
    root: str
    applied: bool
    segments: list[Segment]
    removed: list[str] = Field(default_factory=list)
    failed: dict[str, str] = Field(default_factory=dict)
    stale_bytes: int = 0
    unreadable_pids: int = 0


def _pattern_of(name: str) -> str | None:
    for pattern in PATTERNS:
        if fnmatch.fnmatchcase(name, pattern):
            return pattern
    return None


def _users(root: Path) -> tuple[dict[str, list[int]], int]:
    """Path -> PIDs that have it open or mapped; also how many processes we could not read."""
    users: dict[str, list[int]] = {}
    unreadable = 0
    prefix = str(root).rstrip("/") + "/"
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        seen: set[str] = set()
        try:
            for fd in (entry / "fd").iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith(prefix):
                    seen.add(target.removesuffix(" (deleted)"))
            with (entry / "maps").open() as fh:
                for line in fh:
                    idx = line.find(prefix)
                    if idx >= 0:
                        seen.add(line[idx:].strip().removesuffix(" (deleted)"))
        except (PermissionError, FileNotFoundError, ProcessLookupError):
            if pid != me:
                unreadable += 1
            continue
        for path in seen:
            users.setdefault(path, []).append(pid)
    return users, unreadable


def scan(root: Path = Path("/dev/shm")) -> ShmReport:
    """List engine segments under ``root`` and which live processes use each."""
    users, unreadable = _users(root)
    now = time.time()
    segments: list[Segment] = []
    if root.is_dir():
        for entry in sorted(root.iterdir()):
            pattern = _pattern_of(entry.name)
            if pattern is None or not entry.is_file():
                continue
            try:
                st = entry.stat()
            except OSError:
                continue
            segments.append(
                Segment(
                    path=str(entry),
                    size_bytes=st.st_size,
                    age_s=round(now - st.st_mtime, 1),
                    pattern=pattern,
                    in_use_by=sorted(users.get(str(entry), [])),
                )
            )
    return ShmReport(
        root=str(root),
        applied=False,
        segments=segments,
        stale_bytes=sum(s.size_bytes for s in segments if s.stale),
        unreadable_pids=unreadable,
    )


def clean(root: Path = Path("/dev/shm"), apply: bool = False) -> ShmReport:
    """Scan, and with ``apply`` delete the segments that no live process has open or mapped.

    Each candidate is re-checked just before deletion (a server may have started meanwhile).
    When some processes could not be inspected (other users' processes), nothing is deleted
    unless the segment is owned by us: we cannot prove those processes do not use it.
    """
    report = scan(root)
    report.applied = apply
    if not apply:
        return report
    uid = os.getuid()
    users_now, _ = _users(root)
    for seg in report.segments:
        if not seg.stale or users_now.get(seg.path):
            continue
        path = Path(seg.path)
        try:
            if report.unreadable_pids and path.stat().st_uid != uid and uid != 0:
                report.failed[seg.path] = "owned by another user whose processes we cannot read"
                continue
            path.unlink()
            report.removed.append(seg.path)
        except OSError as exc:
            report.failed[seg.path] = exc.strerror or str(exc)
    return report


def run_shm(root: Path = Path("/dev/shm"), apply: bool = False, json_out: bool = False) -> int:
    """``ceiling shm``: print the listing (and what --apply removed)."""
    from rich.markup import escape

    from ceiling.console import emit_json, out

    report = clean(root, apply=apply)
    if json_out:
        emit_json(report)
        return 0
    o = out()
    if not report.segments:
        o.print(f"no engine/NCCL segments in {report.root}")
        return 0
    for seg in report.segments:
        state = f"in use by pid {seg.in_use_by}" if seg.in_use_by else "stale"
        mark = "removed" if seg.path in report.removed else state
        o.print(f"{seg.size_bytes / 2**20:10.1f} MiB  {escape(seg.path)}  ({mark})")
    stale = [s for s in report.segments if s.stale]
    if not apply:
        o.print(
            f"{len(stale)} stale segment(s), {report.stale_bytes / 2**20:.1f} MiB; "
            "dry run: `ceiling shm --apply` removes them"
        )
    else:
        o.print(f"removed {len(report.removed)} segment(s)")
        for path, why in report.failed.items():
            o.print(f"could not remove {escape(path)}: {why}")
    if report.unreadable_pids:
        o.print(f"note: {report.unreadable_pids} process(es) could not be inspected")
    return 0
