"""/dev/shm hygiene: stale segments go (with --apply only), segments in use stay."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from ceiling.cli import main
from ceiling.errors import CeilingError
from ceiling.run.shm import clean, scan

HOLDER = """
import mmap, sys, time
fh = open(sys.argv[1], "r+b")
mm = mmap.mmap(fh.fileno(), 4096)
fh.close()                      # only mapped now, no open fd
keep = open(sys.argv[2], "rb")  # the other one: open fd, not mapped
print("ready", flush=True)
time.sleep(60)
"""


def make(root, name, size=4096):
    p = root / name
    p.write_bytes(b"\0" * size)
    return p


def test_dry_run_lists_and_apply_removes_only_stale(shm_dir):
    tmp_path = shm_dir
    stale = make(tmp_path, "psm_deadbeef")
    stale2 = make(tmp_path, "nccl-shm-123")
    mapped = make(tmp_path, "vllm_ringbuffer_1")
    opened = make(tmp_path, "torch_555_0")
    other = make(tmp_path, "my-database.db")  # not an engine segment: never touched
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(mapped), str(opened)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        report = scan(tmp_path)
        by_name = {s.path.rsplit("/", 1)[1]: s for s in report.segments}
        assert set(by_name) == {"psm_deadbeef", "nccl-shm-123", "vllm_ringbuffer_1", "torch_555_0"}
        assert by_name["vllm_ringbuffer_1"].in_use_by == [holder.pid]
        assert by_name["torch_555_0"].in_use_by == [holder.pid]
        assert by_name["psm_deadbeef"].stale and by_name["nccl-shm-123"].stale
        assert report.stale_bytes == 2 * 4096

        dry = clean(tmp_path, apply=False)
        assert dry.removed == [] and stale.exists() and stale2.exists()

        applied = clean(tmp_path, apply=True)
        assert sorted(applied.removed) == sorted([str(stale), str(stale2)])
        assert not stale.exists() and not stale2.exists()
        assert mapped.exists() and opened.exists() and other.exists()
    finally:
        holder.kill()
        holder.wait()
    # once the holder is gone its segments are stale too
    time.sleep(0.1)
    again = clean(tmp_path, apply=True)
    assert sorted(again.removed) == sorted([str(mapped), str(opened)])
    assert other.exists()


def test_cli_shm_json(tmp_path, capsys):
    make(tmp_path, "psm_1")
    assert main(["shm", "--root", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["applied"] is False and len(data["segments"]) == 1
    assert (tmp_path / "psm_1").exists()


@pytest.mark.parametrize("root", ["", "   ", "{tmp}"])
def test_apply_refuses_anything_but_a_shared_memory_filesystem(root, tmp_path, capsys,
                                                               monkeypatch):  # fmt: skip
    """Issue 25: `shm --root "" --apply` took the working directory for /dev/shm and deleted
    files there. Now --apply works only where statfs says tmpfs; listing stays allowed."""
    seg = make(tmp_path, "psm_deadbeef")
    monkeypatch.chdir(tmp_path)  # "" would be the working directory
    assert main(["shm", "--root", root.format(tmp=tmp_path), "--apply"]) == 2
    err = capsys.readouterr().err
    # by line: under pytest-xdist a stray server thread of another test in this worker may
    # print to the same captured stderr
    lines = err.splitlines()
    assert any(ln.startswith("error: --root") for ln in lines), err
    assert any(ln.strip().startswith("fix: ") for ln in lines), err
    assert seg.exists()
    with pytest.raises(CeilingError):
        clean(tmp_path, apply=True)  # the library refuses as well, not only the CLI
    assert seg.exists()
    if root == "{tmp}":
        assert main(["shm", "--root", str(tmp_path), "--json"]) == 0  # listing is harmless


def test_apply_on_tmpfs_works(shm_dir, capsys):
    seg = make(shm_dir, "psm_deadbeef")
    assert main(["shm", "--root", str(shm_dir), "--apply", "--json"]) == 0
    assert not seg.exists()
