"""commbench: every input refused before torch is imported or a rank starts, the world size
capped by the machine, and ranks that die with a SIGKILLed ceiling (issue 25)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from ceiling.cli import main


@pytest.fixture
def no_torch(monkeypatch):
    """Reaching torch (or a rank) fails the test: the input had to be refused before."""
    from ceiling.probe import commbench

    def boom(*_a, **_k):
        raise AssertionError("an input error was found only after torch/ranks started")

    monkeypatch.setattr(commbench, "_torch_facts", boom)
    monkeypatch.setattr(commbench, "_run_variant", boom)


@pytest.mark.parametrize(
    "argv",
    [
        ["--preset", "nope"],
        ["--backend", "mpi"],
        ["--buffer-dtype", "complex128"],
        ["--world-sizes", "4096"],
        ["--world-sizes", str((os.cpu_count() or 1) + 3)],
        ["--sizes", "1K..1P"],
        ["--model", "no-such-model"],
        ["--env", "NOEQUALS"],
        ["--reps", "0"],
        ["--budget-ms", "inf"],
        ["--batch", "0"],
    ],
)
def test_bad_inputs_before_any_rank(argv, no_torch, capsys, tmp_path):
    assert main(["commbench", *argv, "--results", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    one_line = "error: " in err and "\n  fix: " in err
    assert one_line or "Error: Invalid value" in err, err  # Click's usage error for a choice
    assert "Traceback" not in err and "warning" not in err
    assert not (tmp_path / "r.json").exists()


RANKS = textwrap.dedent(
    """
    import sys
    from ceiling.probe.ranks import run_ranks
    code = "import os, time; open(os.environ['PIDS'] + os.environ['RANK'], 'w').write(str(os.getpid())); time.sleep(120)"
    run_ranks([sys.executable, "-c", code], 2, {"PIDS": sys.argv[1]}, timeout_s=120)
    """
)


def test_ranks_die_with_a_sigkilled_parent(tmp_path):
    prefix = str(tmp_path / "rank")
    parent = subprocess.Popen([sys.executable, "-c", RANKS, prefix], start_new_session=True)
    pid_files = [tmp_path / f"rank{r}" for r in range(2)]
    end = time.monotonic() + 60
    while not all(p.exists() and p.read_text() for p in pid_files):
        assert time.monotonic() < end and parent.poll() is None, "the ranks did not start"
        time.sleep(0.1)
    ranks = [int(p.read_text()) for p in pid_files]
    time.sleep(1.0)  # the watchdog is up once the ranks are
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    end = time.monotonic() + 30
    while any(psutil.pid_exists(r) and psutil.Process(r).status() != "zombie" for r in ranks):
        assert time.monotonic() < end, f"ranks {ranks} outlived their SIGKILLed parent"
        time.sleep(0.1)
