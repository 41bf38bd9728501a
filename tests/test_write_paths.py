"""Every write goes through ``ceiling.outputs``; a cache that cannot be written never fails a
command; the sweep ledger's SQLite errors and any OSError nothing handled end as one
``error:`` line with a documented exit code, never a traceback."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ceiling.cli import main
from ceiling.errors import CeilingError, ExitStatus, exit_status, from_os_error


@pytest.fixture
def not_a_dir(tmp_path: Path) -> Path:
    """A folder no file can be written under: its parent is a regular file."""
    (tmp_path / "file").write_text("x")
    return tmp_path / "file" / "cache"


def test_trace_capture_keeps_an_earlier_capture_json(tmp_path, monkeypatch):
    from ceiling.flows import trace_capture
    from ceiling.trace.capture import TraceCapture

    monkeypatch.setattr(
        trace_capture, "served_models", lambda url: [SimpleNamespace(owned_by="sglang", id="m")]
    )
    monkeypatch.setattr(
        trace_capture,
        "capture_window",
        lambda url, served, setup, steps, **_: TraceCapture(
            url=url, engine="sglang", steps_asked=steps
        ),
    )
    (tmp_path / "capture.json").write_text("an earlier capture\n")
    res = trace_capture.capture("http://127.0.0.1:9", tmp_path, steps=8)
    assert json.loads((tmp_path / "capture.json").read_text())["steps_asked"] == res.steps_asked
    assert (tmp_path / "capture.json.~1~").read_text() == "an earlier capture\n"
    assert not list(tmp_path.glob(".capture.json.*"))  # no temporary file left


def test_a_flag_cache_that_cannot_be_written_does_not_fail_preflight(not_a_dir, monkeypatch):
    from ceiling.engines import get_engine
    from ceiling.engines.base import EngineInstall
    from ceiling.engines.flags import FlagTable
    from ceiling.engines.vllm import VllmEngine

    monkeypatch.setenv("CEILING_CACHE_DIR", str(not_a_dir))
    table = FlagTable(engine="vllm", version="0.32.0", source="parser", actions=[])
    monkeypatch.setattr(VllmEngine, "dump_flags", lambda self, install: table.model_copy())
    install = EngineInstall(python=sys.executable, command=["vllm"], version="0.32.0")
    got = get_engine("vllm").flag_table(install)
    assert got.cache_path is None and not got.cache_hit


def test_an_extension_cache_that_cannot_be_written_does_not_fail_env(not_a_dir, monkeypatch):
    from ceiling.envcheck import extensions
    from ceiling.envcheck.models import Inventory, TorchRuntime

    monkeypatch.setattr(
        extensions, "_run_load", lambda python, args, timeout_s: (TorchRuntime(), [])
    )
    inv = Inventory(python="py", prefix="/", version="3.11", markers={}, dists=[], torch={})
    _, results, cached = extensions.load_binaries(sys.executable, inv, not_a_dir)
    assert results == [] and not cached


def test_rank_logs_kept_beside_an_earlier_copy(tmp_path):
    from ceiling.probe.ranks import run_ranks

    (tmp_path / "rank0.log").write_text("an earlier run\n")
    code = "import sys; print('rank says hi', file=sys.stderr)"
    out = run_ranks([sys.executable, "-c", code], 1, {}, timeout_s=60, keep_logs=tmp_path)
    assert out.log_dir == str(tmp_path)
    assert "rank says hi" in (tmp_path / "rank0.log").read_text()
    assert (tmp_path / "rank0.log.~1~").read_text() == "an earlier run\n"


# ---- the sweep ledger: SQLite's failures as one line ----------------------------------------


def test_a_ledger_locked_by_another_sweep_is_one_line(tmp_path):
    from ceiling.sweep.ledger import Ledger

    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        ledger.db.execute("PRAGMA busy_timeout = 50")  # not the 30 s a real sweep waits
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(CeilingError) as err:
                ledger.set_meta("k", 1)
        finally:
            other.execute("ROLLBACK")
            other.close()
    assert str(path) in err.value.message and "locked" in err.value.message
    assert "another sweep" in (err.value.fix or "")
    assert err.value.exit_code == ExitStatus.FAILED


@pytest.fixture
def small_tmpfs(mount_tmpfs):
    """A real 128kiB tmpfs (root only; skipped elsewhere): SQLite's SQLITE_FULL for real."""
    return mount_tmpfs("128k")


def test_a_full_disk_under_the_ledger_is_one_line(small_tmpfs):
    from ceiling.sweep.ledger import Ledger

    path = small_tmpfs / "ledger.sqlite"
    with Ledger(path) as ledger:
        ledger.record_repeat("fp", 0, 1.0, {"small": True})
        with pytest.raises(CeilingError) as err:
            ledger.record_repeat("fp", 1, 1.0, {"big": "x" * (1 << 20)})
        assert ledger.repeat_count("fp") == 1  # what was recorded before is still there
    assert str(path) in err.value.message and "full" in err.value.message
    assert "--resume" in (err.value.fix or "") and err.value.exit_code == ExitStatus.FAILED


def test_a_file_that_is_not_a_ledger_is_bad_input(tmp_path):
    from ceiling.sweep.ledger import Ledger

    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"not a database, just bytes" * 100)
    with pytest.raises(CeilingError) as err:
        Ledger(path)
    assert err.value.exit_code == ExitStatus.INPUT and "not a sweep ledger" in (err.value.fix or "")


# ---- any OSError nothing handled: one line, exit 1 -------------------------------------------


@pytest.mark.parametrize(
    ("code", "fix"),
    [(errno.ENOSPC, "free some disk space"), (errno.EACCES, "permissions"),
     (errno.EROFS, "read-only"), (errno.EMFILE, "ulimit"), (errno.EBADF, "run again")],
)  # fmt: skip
def test_an_unhandled_oserror_ends_as_an_error_line(code, fix, monkeypatch, capsys):
    from ceiling.cli import predict as predict_cli

    def fail(*_a: object, **_k: object) -> None:
        raise OSError(code, os.strerror(code), "/somewhere/out.json")

    monkeypatch.setattr(predict_cli, "_str", fail)  # the first thing predict does with a path
    rc = main(["predict", "--model", "llama-3.1-8b", "--gpu", "h200", "--json"])
    got = capsys.readouterr()
    assert rc == ExitStatus.FAILED, got.err
    assert "Traceback" not in got.err
    assert f"error: /somewhere/out.json: {os.strerror(code)}" in got.err
    assert "fix: " in got.err and fix in got.err
    assert json.loads(got.out)["kind"] == "failed"


def test_oserrors_are_mapped_in_the_one_place():
    assert exit_status(OSError(errno.ENOSPC, "No space left on device")) is ExitStatus.FAILED
    assert exit_status(PermissionError(errno.EACCES, "Permission denied")) is ExitStatus.FAILED
    long_name = OSError(errno.ENAMETOOLONG, "File name too long", "a" * 300)
    assert exit_status(long_name) is ExitStatus.INPUT
    assert from_os_error(ValueError("a bug")) is None and exit_status(ValueError()) is None
