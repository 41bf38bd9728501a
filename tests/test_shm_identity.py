"""``shm --apply`` never deletes a segment a live process holds, whatever path it is seen by.

Real processes hold real files on the real shared-memory tmpfs (a private directory under
/dev/shm, so that nothing of other users is touched): by open descriptor only, by mapping only,
or both; the scan goes through a symlinked root (``/run/shm -> /dev/shm``), a bind mount, or the
holder used the other path. Identity is device + inode, never the path text.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ceiling.run import shm

HOLDER = r"""
import mmap, os, sys, time
both, maponly, fdonly = sys.argv[1:4]
fd_both = os.open(both, os.O_RDWR)
m1 = mmap.mmap(fd_both, 4096)
fd = os.open(maponly, os.O_RDWR)
m2 = mmap.mmap(fd, 4096)
os.close(fd)                      # mapped only: no descriptor left
fd_only = os.open(fdonly, os.O_RDONLY)   # open only: never mapped
print("ready", flush=True)
sys.stdin.read()
"""

SHM = Path("/dev/shm")


def _make(d: Path) -> dict[str, Path]:
    names = {
        "both": "psm_both",
        "maponly": "vllm_ringbuffer_map",
        "fdonly": "nccl-shm-fd",
        "stale": "torch_999_0",
    }
    out = {}
    for key, name in names.items():
        p = d / name
        p.write_bytes(b"\0" * 4096)
        out[key] = p
    return out


@pytest.fixture
def holder():
    procs: list[subprocess.Popen[str]] = []

    def start(*paths: Path) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, *map(str, paths)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _check_applied(root: Path, files: dict[str, Path], pid: int) -> None:
    report = shm.scan(root)
    by_name = {Path(s.path).name: s for s in report.segments}
    for key in ("both", "maponly", "fdonly"):
        assert by_name[files[key].name].in_use_by == [pid], key
    assert by_name[files["stale"].name].stale
    applied = shm.clean(root, apply=True)
    assert [Path(p).name for p in applied.removed] == [files["stale"].name]
    for key in ("both", "maponly", "fdonly"):
        assert files[key].exists(), f"{key} was deleted while held"
    assert not files["stale"].exists()


def test_symlinked_root(shm_dir, holder, tmp_path):
    """The reported bug: --root through a symlink listed every live segment as stale."""
    files = _make(shm_dir)
    proc = holder(files["both"], files["maponly"], files["fdonly"])
    link = tmp_path / "run-shm"
    link.symlink_to(shm_dir)
    report = shm.scan(link)
    assert report.root == str(link) and report.root_real == str(shm_dir)
    assert all(s.path.startswith(str(link)) for s in report.segments)
    _check_applied(link, files, proc.pid)


def test_holder_used_the_symlinked_path(shm_dir, holder, tmp_path):
    """The other direction: the holder opened the files through a symlink, we scan the real
    directory (what /proc shows as the path differs from ours; device + inode do not)."""
    files = _make(shm_dir)
    link = tmp_path / "via-link"
    link.symlink_to(shm_dir)
    proc = holder(*(link / files[k].name for k in ("both", "maponly", "fdonly")))
    _check_applied(shm_dir, files, proc.pid)


def test_bind_mount(shm_dir, holder, tmp_path):
    """A bind mount shows the same files under another path (as containers do)."""
    mnt = tmp_path / "bind"
    mnt.mkdir()
    done = subprocess.run(["mount", "--bind", str(shm_dir), str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {done.stderr.decode().strip()}")
    try:
        files = _make(shm_dir)
        proc = holder(files["both"], files["maponly"], files["fdonly"])
        _check_applied(mnt, files, proc.pid)
        # and held through the bind mount, scanned at the real directory
        again = {k: shm_dir / f"{p.name}2" for k, p in files.items()}
        for p in again.values():
            p.write_bytes(b"\0" * 4096)
        proc2 = holder(*(mnt / again[k].name for k in ("both", "maponly", "fdonly")))
        report = shm.clean(shm_dir, apply=True)
        assert [Path(p).name for p in report.removed] == [again["stale"].name]
        assert all(again[k].exists() for k in ("both", "maponly", "fdonly"))
        users = {Path(s.path).name: s.in_use_by for s in shm.scan(shm_dir).segments}
        assert all(users[again[k].name] == [proc2.pid] for k in ("both", "maponly", "fdonly"))
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_real_dev_shm_through_run_shm(holder):
    """The machine's own /run/shm -> /dev/shm symlink, real POSIX segments (dry run only:
    the shared machine's other segments are never touched)."""
    from multiprocessing import shared_memory

    run_shm = Path("/run/shm")
    if not run_shm.is_symlink() or os.path.realpath(run_shm) != "/dev/shm":
        pytest.skip("/run/shm is not a symlink to /dev/shm here")
    seg = shared_memory.SharedMemory(create=True, size=4096)  # /dev/shm/psm_...: fd + mapping
    try:
        mine = f"/run/shm/{seg.name.lstrip('/')}"
        report = shm.scan(run_shm)
        by_path = {s.path: s for s in report.segments}
        assert mine in by_path, "the segment was not listed"
        assert os.getpid() in by_path[mine].in_use_by
        assert not by_path[mine].stale
    finally:
        seg.close()
        seg.unlink()


def test_replaced_between_scan_and_delete(shm_dir):
    """A file that got a new inode under the same name after the scan is not deleted."""
    p = shm_dir / "psm_recycled"
    p.write_bytes(b"\0" * 16)
    report = shm.scan(shm_dir)
    (seg,) = report.segments
    p.unlink()
    p.write_bytes(b"\1" * 16)  # a new segment with the old name (a new server)
    assert "replaced" in (shm._recheck(seg) or "")
    assert p.exists()


def test_symlink_inside_root_is_not_followed(shm_dir, tmp_path):
    """A segment-named symlink pointing elsewhere is never listed (nor deleted through)."""
    target = tmp_path / "precious"
    target.write_text("keep me")
    (shm_dir / "psm_evil").symlink_to(target)
    report = shm.clean(shm_dir, apply=True)
    assert report.segments == [] and target.read_text() == "keep me"
