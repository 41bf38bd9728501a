"""``ceiling deploy`` end to end: the unit it writes passes ``systemd-analyze verify``, a REAL
systemd (in private namespaces, tests/systemd_ns.py) starts it, ``ExecStartPost`` (``ceiling
ready``) holds the unit in "activating" until the engine answers, the engine's log is in the
journal, and after ``kill -9`` of the engine systemd restarts it and it is ready again.

The engine is llama.cpp with the tiny GGUF (ready in a second or two)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ceiling.deploy.command import validate_plan, write_plan
from ceiling.deploy.render import build_plan
from ceiling.run.ports import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from systemd_ns import NestedSystemd, available

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]


def _probe(sd: NestedSystemd, url: str) -> dict:
    code = f"import urllib.request,json; print(urllib.request.urlopen('{url}', timeout=5).read().decode())"
    proc = sd.run(sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_unit_comes_up_ready_logs_to_the_journal_and_restarts_after_kill(
    cpu_tiny_llamacpp_variant, tmp_path
):
    why = available()
    if why:
        pytest.skip(f"cannot run systemd in namespaces here: {why}")
    variant = cpu_tiny_llamacpp_variant.with_overrides(port=free_port(), log_dir=str(tmp_path))
    plan = build_plan(
        variant, tmp_path / "deploy", image="example/llama-server:test", ready_timeout_s=120
    )
    write_plan(plan)
    checks = {c.tool: c for c in validate_plan(plan)}
    unit_check = checks["systemd-analyze verify"]
    assert unit_check.status == "passed", unit_check.output
    url = plan.url + "/v1/models"
    with NestedSystemd(Path(plan.unit.path), tmp_path) as sd:
        # "active" only after ExecStartPost (ceiling ready) saw the health endpoints answer
        first = sd.wait_for({"ActiveState": "active", "SubState": "running"}, timeout=180)
        assert _probe(sd, url)["data"][0]["id"] == "tiny"
        pid = sd.show("MainPID")["MainPID"]
        assert sd.show("NRestarts")["NRestarts"] == "0"
        journal = sd.run("journalctl", "-u", sd.unit, "--no-pager", "-o", "cat").stdout
        assert "llama_model_loader" in journal  # the engine's own log, in the journal
        assert "engine/NCCL segments" in journal  # ExecStartPre: ceiling shm --apply ran
        assert "ready: " in journal  # ExecStartPost: ceiling ready
        assert sd.run("kill", "-9", pid).returncode == 0
        again = sd.wait_for(
            {"NRestarts": "1", "ActiveState": "active", "SubState": "running"}, timeout=120
        )
        assert again.get("MainPID") != pid
        assert _probe(sd, url)["data"][0]["id"] == "tiny"
        print(f"first start: {first}; after kill -9: {again}", file=sys.stderr)
