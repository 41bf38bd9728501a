"""Fixtures shared by the test modules."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

# Every doctor run in the tests (fast stand-ins and real engines, in-process and through the
# CLI's subprocesses) checks that each stage reads and writes only what STAGES declares
# (flows/doctor_watch.py): the declarations are only as true as the runs that check them.
os.environ.setdefault("CEILING_CHECK_STAGES", "1")


@pytest.fixture
def priors_only(monkeypatch):
    """Predict from the shipped priors, whether or not the tables extra is installed."""
    from ceiling.predict import tables

    monkeypatch.setenv("CEILING_NO_TABLES", "1")
    tables.info.cache_clear()
    yield
    tables.info.cache_clear()


@pytest.fixture
def shm_dir():
    """A private directory on the real shared-memory tmpfs (``shm --apply`` deletes only on
    one)."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    d = shm / f"ceiling-test-{uuid.uuid4().hex[:12]}"
    d.mkdir()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def mount_tmpfs(tmp_path):
    """``mount_tmpfs(size)``: a real tmpfs of ``size`` (e.g. "64k") under ``tmp_path``, for a
    full disk from the kernel itself (root only; the test is skipped elsewhere)."""
    import subprocess

    mounted: list[Path] = []

    def mount(size: str) -> Path:
        mnt = tmp_path / f"tmpfs-{len(mounted)}"
        mnt.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True
        )
        if done.returncode != 0:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        mounted.append(mnt)
        return mnt

    try:
        yield mount
    finally:
        for mnt in mounted:
            subprocess.run(["umount", str(mnt)], capture_output=True)
