"""`ceiling stop` never signals what ceiling cannot prove it started (issue 25).

Each case plants a record that points at a live process ceiling did not start (a reused PID),
or one whose identity cannot be proved, and checks that the process is still running after
`ceiling stop --all`; and that the records of an engine that died at start-up are gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import pytest

from ceiling.cli import main
from ceiling.engines.variant import load_variant
from ceiling.errors import CeilingError
from ceiling.run import guard
from ceiling.run.launcher import start
from fake_engine import write_variant

DEAD_OWNER = 2**22 + 12345  # above any pid_max default: no such process


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    d = tmp_path / "state"
    d.mkdir()
    monkeypatch.setenv("CEILING_STATE_DIR", str(d))
    return d


@pytest.fixture
def leader():
    """An unrelated session leader (what a reused PID points at)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            start_new_session=True)  # fmt: skip
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _plant(state_dir, pid: int, **fields) -> None:
    doc = {"pid": pid, "port": 1, "host": "127.0.0.1", "variant": "old", "engine": "vllm",
           "log_path": "/nonexistent.log", "owner_pid": DEAD_OWNER, **fields}  # fmt: skip
    (state_dir / f"{pid}.json").write_text(json.dumps(doc))


def _stop(capsys) -> tuple[int, str, str]:
    rc = main(["stop", "--all", "--json"])
    seen = capsys.readouterr()
    return rc, seen.out, seen.err


def test_a_record_without_start_times_is_refused(state_dir, leader, capsys):
    """A record without an explicit schema version is read as the old format (start times in
    clock ticks, dropped): the PID may have been reused, so nothing is signalled."""
    _plant(state_dir, leader.pid, leader_start=123.0)
    rc, out, err = _stop(capsys)
    assert rc == 1 and "not signalled" in err and f"kill -TERM -- -{leader.pid}" in err
    assert json.loads(out)["refused"][0]["pid"] == leader.pid
    time.sleep(0.3)
    assert leader.poll() is None, "stop signalled a process it could not prove it started"
    assert (state_dir / f"{leader.pid}.json").exists()  # kept: the user decides


def test_a_reused_pid_with_another_start_time_is_left_alone(state_dir, leader, capsys):
    real = guard.start_time(leader.pid)
    _plant(state_dir, leader.pid, schema_version=3, leader_start=real - 1000.0, token="t")
    rc, out, _ = _stop(capsys)
    assert rc == 0 and json.loads(out)["stopped"] == []
    time.sleep(0.3)
    assert leader.poll() is None
    assert not (state_dir / f"{leader.pid}.json").exists()  # its server is gone: record too


def test_members_of_a_dead_leader_need_the_token(state_dir, capsys, tmp_path):
    """The leader died, a process keeps its group and session: only the record's token in its
    environment proves it is the engine's child (vLLM's EngineCore after its API server)."""
    pidfile = tmp_path / "child"
    code = ("import subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(c.pid))\n")  # fmt: skip
    for token, env_token, survives in (("abc", None, True), ("abc", "abc", False)):
        env = {**os.environ, **({guard.TOKEN_ENV: env_token} if env_token else {})}
        lead = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, env=env)
        start = guard.start_time(lead.pid)
        lead.wait()  # the leader is gone, its child lives on in its group and session
        child = int(pidfile.read_text())
        try:
            assert guard.group_members(lead.pid) == [child]
            _plant(state_dir, lead.pid, schema_version=3, leader_start=start, token=token)
            rc, out, err = _stop(capsys)
            time.sleep(0.3)
            alive = guard.start_time(child) is not None and guard.group_members(lead.pid)
            # the refusal's reason alone (the whole JSON is cut short in pytest's message)
            why = [r.get("why") or r for r in json.loads(out or "{}").get("refused", [])]
            assert bool(alive) == survives, (token, env_token, why, err[-300:])
            assert rc == (1 if survives else 0)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, 9)
        for p in state_dir.glob("*.json"):
            p.unlink()


def test_an_engine_that_dies_at_start_up_leaves_no_record(tmp_path, state_dir):
    variant = load_variant(write_variant(tmp_path, "--die-at-start"))
    with pytest.raises(CeilingError, match="engine died"):
        start(variant, timeout_s=60, progress=False)
    assert list(state_dir.glob("*.json")) == []


def test_a_variant_name_never_leaves_the_log_dir(tmp_path, state_dir):
    variant = load_variant(write_variant(tmp_path, "--die-at-start"))
    variant = variant.model_copy(update={"name": "../../escape"})
    with pytest.raises(CeilingError):
        start(variant, timeout_s=60, progress=False)
    names = [p.name for p in (tmp_path / "logs").iterdir()]
    assert names and all(n.startswith("______escape-") for n in names), names
    assert not list(tmp_path.parent.glob("escape*"))


def test_the_launchers_record_holds_the_identity(tmp_path, state_dir):
    """The record a launch writes carries the leader's start time and the token (a record
    built in code was once read as the old format and lost its start times)."""
    server = start(load_variant(write_variant(tmp_path)), timeout_s=60, progress=False)
    try:
        rec = guard.ServerRecord.model_validate_json((state_dir / f"{server.pid}.json").read_text())
        assert rec.leader_start == guard.start_time(server.pid) and rec.owner_start is not None
        assert rec.token and rec.identify()[0] == "ours"
    finally:
        server.stop()
    assert list(state_dir.glob("*.json")) == []
