"""Interrupts, a killed ceiling, API keys and readiness, against a fake engine (fast).

What is checked is behaviour a user sees: "stopping ..." at once, every process of the engine's
group gone afterwards, exit 130, the engine never outliving a SIGKILLed ceiling, readiness with
the variant's key, 401 read as "ready but needs a key", the timeout naming the right option.
The same cases run against real vLLM in tests/engine/test_interrupts_vllm.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ceiling import interrupts
from ceiling.engines.variant import load_variant
from ceiling.errors import CeilingError
from ceiling.run import guard
from ceiling.run.launcher import port_in_use, start
from fake_engine import write_variant

WAIT_S = 60  # generous bounds for a loaded 2-core machine; no test asserts a duration


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    d = tmp_path / "state"
    monkeypatch.setenv("CEILING_STATE_DIR", str(d))
    return d


def _until(cond, what: str, timeout: float = WAIT_S) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.1)


def _record(state: Path) -> guard.ServerRecord:
    _until(lambda: any(state.glob("*.json")), "the server record")
    return guard.ServerRecord.model_validate_json(next(state.glob("*.json")).read_text())


def _ceiling(*argv: str, env: dict | None = None) -> subprocess.Popen[str]:
    """``ceiling ARGV`` as a user runs it: own session (so a test can signal it alone)."""
    return subprocess.Popen(
        [sys.executable, "-m", "ceiling", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


# ---- readiness and API keys ------------------------------------------------------------


def test_readiness_polls_with_the_variants_key(tmp_path):
    variant = load_variant(write_variant(tmp_path, "--api-key", "sk-fake-123456"))
    server = start(variant, timeout_s=WAIT_S, progress=False)
    try:
        assert server.phase == "ready" and server.model == "fake"
        assert server.api_key == "sk-fake-123456" and not server.needs_key
        assert server.key_note() is None
        meta = server.log_path.with_suffix(".launch.json").read_text()
        assert "sk-fake-123456" not in meta and "--api-key" in meta
    finally:
        result = server.stop()
    assert result.leftover_pids == []


def test_key_from_the_variant_env_is_used(tmp_path):
    variant = load_variant(write_variant(tmp_path, env={"VLLM_API_KEY": "sk-env-abcdef"}))
    server = start(variant, timeout_s=WAIT_S, progress=False)
    try:
        assert server.api_key == "sk-env-abcdef" and not server.needs_key
    finally:
        server.stop()


def test_401_is_ready_but_needs_a_key(tmp_path):
    variant = load_variant(write_variant(tmp_path, "--hidden-key", "sk-unseen-999"))
    server = start(variant, timeout_s=WAIT_S, progress=False)
    try:
        assert server.phase == "ready" and server.needs_key and server.api_key is None
        note = server.key_note() or ""
        assert "requires an API key" in note and "CEILING_API_KEY" in note
        assert server.info().needs_api_key is True
    finally:
        server.stop()


def test_timeout_names_the_callers_option(tmp_path):
    variant = load_variant(write_variant(tmp_path, "--never-ready"))
    with pytest.raises(CeilingError, match="not ready after") as err:
        start(variant, timeout_s=2, progress=False, timeout_option="--launch-timeout")
    assert "--launch-timeout" in (err.value.fix or "")
    assert err.value.exit_code == 3


def test_phase_lines_without_a_terminal(tmp_path):
    proc = _ceiling("launch", "--skip-preflight", "--exit-when-ready", str(write_variant(tmp_path)))
    _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, err
    assert "fake: starting" in err or "fake: loading weights" in err, err
    assert "ready" in err


# ---- interrupts --------------------------------------------------------------------------


def test_ctrl_c_during_startup_kills_an_engine_that_ignores_sigterm(tmp_path, state_dir):
    proc = _ceiling(
        "launch", "--skip-preflight", str(write_variant(tmp_path, "--ignore-term", "--never-ready"))
    )
    rec = _record(state_dir)
    _until(lambda: len(guard.group_members(rec.pid)) >= 2, "the engine and its child")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 130, err
    assert "stopping" in err and "sending SIGKILL" in err and "starting up" in err, err
    assert "Traceback" not in err
    assert guard.group_members(rec.pid) == []
    assert not list(state_dir.glob("*.json")), "the record of a stopped server is removed"


def test_second_signal_skips_the_grace(tmp_path, state_dir):
    proc = _ceiling(
        "launch", "--skip-preflight", str(write_variant(tmp_path, "--ignore-term", "--never-ready"))
    )
    rec = _record(state_dir)
    _until(lambda: len(guard.group_members(rec.pid)) >= 2, "the engine and its child")
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)  # inside the 5 s grace of the teardown
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 130, err
    assert "not waiting any longer" in err, err
    assert guard.group_members(rec.pid) == []


def test_sigkilled_ceiling_does_not_leave_the_engine_running(tmp_path, state_dir):
    """The watchdog ends the engine's whole group when ceiling dies by SIGKILL."""
    variant = write_variant(tmp_path, "--ignore-term")
    proc = _ceiling("launch", "--skip-preflight", str(variant))
    rec = _record(state_dir)
    _until(lambda: port_in_use("127.0.0.1", rec.port), "the fake engine to listen")
    assert rec.watchdog_pid and rec.owner_pid == proc.pid
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=WAIT_S)
    _until(lambda: guard.group_members(rec.pid) == [], "the watchdog to end the engine")
    _until(lambda: not port_in_use("127.0.0.1", rec.port), "the port to be free")
    _until(lambda: not list(state_dir.glob("*.json")), "the record to be removed")


def test_ceiling_stop_ends_what_outlived_ceiling_and_its_watchdog(tmp_path, state_dir, capsys):
    from ceiling.cli import main

    proc = _ceiling("launch", "--skip-preflight", str(write_variant(tmp_path)))
    rec = _record(state_dir)
    _until(lambda: port_in_use("127.0.0.1", rec.port), "the fake engine to listen")
    assert rec.watchdog_pid is not None
    os.kill(rec.watchdog_pid, signal.SIGKILL)  # the fallback case: the watchdog died too
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=WAIT_S)
    time.sleep(1.0)
    assert guard.group_members(rec.pid), "nothing ended the engine: the case `stop` is for"
    assert [r.pid for r in guard.orphans()] == [rec.pid]
    assert main(["shm", "--root", str(tmp_path)]) == 0
    assert "outlived the ceiling that launched them" in capsys.readouterr().out
    assert main(["stop", "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert [d["pid"] for d in done["stopped"]] == [rec.pid]
    assert done["stopped"][0]["leftover_pids"] == []
    assert guard.group_members(rec.pid) == []
    assert not port_in_use("127.0.0.1", rec.port)


def test_stop_leaves_servers_of_a_running_ceiling_alone(tmp_path, state_dir, capsys):
    from ceiling.cli import main

    server = start(load_variant(write_variant(tmp_path)), timeout_s=WAIT_S, progress=False)
    try:
        assert main(["stop"]) == 0
        assert "belong to a running ceiling" in capsys.readouterr().out
        assert server.alive()
    finally:
        server.stop()


def test_signals_during_a_teardown_hurry_it_instead_of_aborting_it():
    interrupts.reset()
    # a first signal during a teardown: no raise inside it, raised once it is done
    with pytest.raises(KeyboardInterrupt), interrupts.shielded():
        interrupts.handle(signal.SIGINT, None)
        assert interrupts.hurry() and interrupts.requested() == signal.SIGINT
    # the usual case: the first signal raises, the teardown it starts only hurries
    interrupts.reset()
    with pytest.raises(KeyboardInterrupt):
        interrupts.handle(signal.SIGTERM, None)
    assert interrupts.describe() == "SIGTERM" and not interrupts.hurry()
    with interrupts.shielded():
        interrupts.handle(signal.SIGINT, None)
    assert interrupts.hurry()
    interrupts.reset()


@pytest.mark.parametrize(
    ("sig", "said"),
    [(signal.SIGINT, "interrupted (Ctrl-C)"), (signal.SIGTERM, "terminated (SIGTERM)"),
     (signal.SIGHUP, "terminated (SIGHUP)")],
)  # fmt: skip
def test_a_bench_names_the_signal_that_stopped_it(sig, said):
    """The result's partial_reason says which signal ended the bench (a closed terminal is
    SIGHUP, not SIGTERM)."""
    import asyncio

    from ceiling.bench.load import LoadState
    from ceiling.bench.runner import _on_sigint

    loop = asyncio.new_event_loop()
    state = LoadState(client=None)  # type: ignore[arg-type]  # stopping needs no client
    interrupts.reset()
    try:
        _on_sigint(state, loop, sig, {})
    finally:
        loop.close()
        interrupts.reset()
    assert state.interrupted and state.reason == said
