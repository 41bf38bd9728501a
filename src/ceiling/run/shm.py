"""/dev/shm hygiene: find the segments engines and NCCL leave behind, remove only unused ones.

A crashed vLLM/SGLang/NCCL run leaves shared-memory segments (``psm_*``, ``nccl-*``, ``vllm_*``,
``torch_*``, POSIX semaphores ``sem.*``, ...) that fill a small container /dev/shm and make the
next launch die with a bus error. The usual ritual (``rm -f /dev/shm/...``) also deletes the
segments of a server that is still running. Here a segment is removed only when no live process
has it open (``/proc/*/fd``) or mapped (``/proc/*/maps``); the default is a dry run.

A segment is identified by its device and inode, never by its path text: the root may be a
symlink (``/run/shm -> /dev/shm`` on Debian/Ubuntu), a bind mount, or seen by the holder under
another path (another mount namespace, a container). ``stat`` on ``/proc/PID/fd/N`` gives the
device+inode of what the descriptor holds; ``/proc/PID/maps`` lists ``major:minor inode`` of every
mapping. Just before unlinking, the path is re-checked: same device+inode, still unused.

Why this reads /proc itself instead of psutil: psutil lists a process's open files and memory
maps by PATH only (``Process.open_files``, ``memory_maps``), and a path is exactly what cannot
be trusted here; the device+inode of a descriptor (``stat`` through ``/proc/PID/fd/N``) and of a
mapping (``/proc/PID/maps``) are not in its API. psutil gives the list of processes.
"""

from __future__ import annotations

import ctypes
import fnmatch
import os
import stat as statmod
import time
from pathlib import Path

import psutil
from pydantic import BaseModel, Field

from ceiling.errors import CeilingError
from ceiling.run.guard import ServerRecord, orphans

SCHEMA_VERSION = 2
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

Key = tuple[int, int]  # (st_dev, st_ino)


class Segment(BaseModel):
    """One file in /dev/shm that matches an engine pattern."""

    path: str
    real_path: str = Field("", description="the path with symlinks of the root resolved")
    device: int = 0
    inode: int = 0
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
    root_real: str = ""
    applied: bool
    segments: list[Segment]
    removed: list[str] = Field(default_factory=list)
    failed: dict[str, str] = Field(default_factory=dict)
    stale_bytes: int = 0
    unreadable_pids: int = 0
    orphaned_engines: list[int] = Field(
        default_factory=list, description="engine groups whose ceiling is gone (ceiling stop)"
    )
    # the orphaned servers' records, and their live processes -> the server (for the listing)
    orphans: list[ServerRecord] = Field(default_factory=list, exclude=True)
    orphan_of: dict[int, int] = Field(default_factory=dict, exclude=True)


def _pattern_of(name: str) -> str | None:
    for pattern in PATTERNS:
        if fnmatch.fnmatchcase(name, pattern):
            return pattern
    return None


def _maps_keys(pid_dir: str, devices: set[int]) -> set[Key]:
    """(device, inode) of every file mapping of one process on one of ``devices``."""
    keys: set[Key] = set()
    with open(f"{pid_dir}/maps", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            # address perms offset dev inode [path]
            parts = line.split(None, 5)
            if len(parts) < 5 or parts[4] == "0":
                continue
            major, _, minor = parts[3].partition(":")
            try:
                dev = os.makedev(int(major, 16), int(minor, 16))
                ino = int(parts[4])
            except ValueError:
                continue
            if dev in devices:
                keys.add((dev, ino))
    return keys


def _fd_keys(pid_dir: str, devices: set[int]) -> set[Key]:
    """(device, inode) of every open descriptor of one process on one of ``devices``."""
    keys: set[Key] = set()
    fd_dir = f"{pid_dir}/fd"
    for name in os.listdir(fd_dir):
        try:
            st = os.stat(f"{fd_dir}/{name}")  # follows the magic link to the held file
        except OSError:
            continue  # closed meanwhile
        if st.st_dev in devices:
            keys.add((st.st_dev, st.st_ino))
    return keys


def holders(keys: set[Key]) -> tuple[dict[Key, list[int]], int]:
    """For each (device, inode): the PIDs that hold it open or mapped; also how many processes
    could not be inspected (other users' processes without privileges)."""
    users: dict[Key, list[int]] = {}
    if not keys:
        return users, 0
    devices = {dev for dev, _ in keys}
    unreadable = 0
    me = os.getpid()
    for pid in psutil.pids():
        pid_dir = f"/proc/{pid}"
        try:
            held = _fd_keys(pid_dir, devices) | _maps_keys(pid_dir, devices)
        except (PermissionError, FileNotFoundError, ProcessLookupError):
            if pid != me and os.path.exists(pid_dir):
                unreadable += 1
            continue
        for key in held & keys:
            users.setdefault(key, []).append(pid)
    return users, unreadable


def _segments(root: Path) -> list[tuple[Segment, Key]]:
    """Engine segments directly under ``root`` (regular files only; symlinks are never
    followed: deleting through one would hit a file elsewhere)."""
    real = Path(os.path.realpath(root))
    now = time.time()
    found: list[tuple[Segment, Key]] = []
    try:
        entries = sorted(os.scandir(real), key=lambda e: e.name)
    except OSError:
        return found
    for entry in entries:
        pattern = _pattern_of(entry.name)
        if pattern is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not statmod.S_ISREG(st.st_mode):
            continue
        seg = Segment(
            path=str(root / entry.name),
            real_path=str(real / entry.name),
            device=st.st_dev,
            inode=st.st_ino,
            size_bytes=st.st_size,
            age_s=round(now - st.st_mtime, 1),
            pattern=pattern,
        )
        found.append((seg, (st.st_dev, st.st_ino)))
    return found


def scan(root: Path = Path("/dev/shm")) -> ShmReport:
    """List engine segments under ``root`` and which live processes use each."""
    found = _segments(root)
    users, unreadable = holders({key for _, key in found})
    for seg, key in found:
        seg.in_use_by = sorted(users.get(key, []))
    segments = [seg for seg, _ in found]
    return ShmReport(
        root=str(root),
        root_real=os.path.realpath(root),
        applied=False,
        segments=segments,
        stale_bytes=sum(s.size_bytes for s in segments if s.stale),
        unreadable_pids=unreadable,
    )


def _recheck(seg: Segment) -> str | None:
    """Why ``seg`` must not be deleted now (None: it may be): the file at its real path is
    another one than scanned, or a process holds it."""
    try:
        st = os.lstat(seg.real_path)
    except FileNotFoundError:
        return "gone already"
    except OSError as exc:
        return exc.strerror or str(exc)
    key = (st.st_dev, st.st_ino)
    if key != (seg.device, seg.inode) or not statmod.S_ISREG(st.st_mode):
        return "replaced since the scan (another file has its name now)"
    users, _ = holders({key})
    if users.get(key):
        return f"in use by pid {sorted(users[key])} (opened since the scan)"
    return None


def clean(root: Path = Path("/dev/shm"), apply: bool = False) -> ShmReport:
    """Scan, and with ``apply`` delete the segments that no live process has open or mapped.

    Each candidate is re-checked just before deletion (a server may have started meanwhile).
    When some processes could not be inspected (other users' processes), nothing is deleted
    unless the segment is owned by us: we cannot prove those processes do not use it.
    """
    if apply:
        check_shm_root(root, apply=True)
    report = scan(root)
    report.applied = apply
    if not apply:
        return report
    uid = os.getuid()
    for seg in report.segments:
        if not seg.stale:
            continue
        try:
            owner = os.lstat(seg.real_path).st_uid
        except OSError:
            owner = uid
        if report.unreadable_pids and owner != uid and uid != 0:
            report.failed[seg.path] = "owned by another user whose processes we cannot read"
            continue
        why = _recheck(seg)
        if why is not None:
            if why != "gone already":
                report.failed[seg.path] = why
            continue
        try:
            os.unlink(seg.real_path)
            report.removed.append(seg.path)
        except OSError as exc:
            report.failed[seg.path] = exc.strerror or str(exc)
    return report


#: statfs(2) f_type of a shared-memory filesystem (linux/magic.h).
TMPFS_MAGIC = 0x01021994


def fs_type(path: str | Path) -> int | None:
    """statfs(2) ``f_type`` of the filesystem holding ``path`` (None when it cannot be read).

    By hand through ctypes: Python has statvfs (no type field) but no statfs, and matching
    /proc/mounts by path text would be fooled by symlinks and bind mounts. ``f_type`` is the
    first field of ``struct statfs`` on every Linux architecture; the buffer is larger than
    any architecture's struct."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(512)
        if libc.statfs(os.fsencode(str(path)), buf) != 0:
            return None
        return int(ctypes.c_long.from_buffer(buf).value) & 0xFFFFFFFF
    except (OSError, AttributeError, ValueError):
        return None


def check_shm_root(root: str | Path, apply: bool) -> Path:
    """The root to scan: an existing directory; with ``apply`` also a shared-memory (tmpfs)
    filesystem, checked by filesystem type, so that no path (``--root ""`` = the working
    directory, ``--root ~``) ever lets ``--apply`` delete ordinary files."""
    fix = "pass the shared-memory mount, e.g. --root /dev/shm"
    if not str(root).strip():
        raise CeilingError("--root is empty", fix=fix)
    path = Path(root)
    if not path.is_dir():
        raise CeilingError(f"--root {root} is not a directory", fix=fix)
    if apply and fs_type(path) != TMPFS_MAGIC:
        raise CeilingError(
            f"--root {root} is not on a shared-memory (tmpfs) filesystem: --apply deletes "
            "only there",
            fix=fix + " (without --apply any directory is listed)",
        )
    return path


def shm_report(root: str | Path = Path("/dev/shm"), apply: bool = False) -> ShmReport:
    """``ceiling shm``: the listing (``apply``: and what was removed), with the engine servers
    whose ceiling is gone (``ceiling stop`` ends them and frees their segments)."""
    path = check_shm_root(root, apply)
    report = clean(path, apply=apply)
    report.orphans = orphans()
    report.orphan_of = {pid: rec.pid for rec in report.orphans for pid in rec.members()}
    report.orphaned_engines = sorted(set(report.orphan_of.values()))
    return report
