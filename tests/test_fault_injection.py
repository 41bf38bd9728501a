"""Fault injection on a real ceiling process (issue 25): SIGHUP ends a bench exactly as SIGTERM
does (the results gathered so far are written), and after SIGKILL at any moment each output is
complete or absent, never half a file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def sse_url():
    """The synthetic server as a process: slow tokens, so a bench runs for a while."""
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "sse_server.py"), "--itl", "0.02"],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("READY "), line
    yield line.split()[1]
    proc.kill()
    proc.wait()


def _ceiling(*argv: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    return subprocess.Popen([sys.executable, "-m", "ceiling", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip


def _wait_for(cond, what: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sighup_ends_a_bench_as_sigterm_does(sig, sse_url, tmp_path):
    out = tmp_path / "r.json"
    proc = _ceiling("bench", "--url", sse_url, "--max-tokens", "50", "--requests", "50",
                    "--warmup", "0", "--out", str(out))  # fmt: skip
    _wait_for(lambda: _finished(sse_url) >= 2, "two measured requests")  # inside the measurement
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    doc = json.loads(out.read_text())
    assert doc["partial"] and doc["interrupted"], doc.get("partial_reason")
    assert "Traceback" not in err


def _finished(url: str) -> int:
    """Requests the synthetic server finished (its /metrics e2e count)."""
    import re
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    m = re.search(r"vllm:e2e_request_latency_seconds_count\{[^}]*\} (\d+)", text)
    return int(m.group(1)) if m else 0


def _complete_or_absent(folder: Path) -> list[str]:
    """Every JSON file under ``folder`` parses (a half-written one would not)."""
    seen = []
    for p in folder.rglob("*.json"):
        json.loads(p.read_text())
        seen.append(p.name)
    return seen


@pytest.mark.parametrize("delay", [0.5, 2.0, 5.0])
def test_sigkill_leaves_every_output_complete_or_absent(delay, sse_url, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64}))
    out = tmp_path / "o"
    proc = _ceiling("doctor", "--url", sse_url, "--model", str(model), "--max-tokens", "40",
                    "--repeat", "2", "--concurrency", "1,2", "--no-telemetry", "--no-sanity",
                    "--no-measure-cpu", "--out-dir", str(out))  # fmt: skip
    time.sleep(delay)
    proc.kill()
    proc.communicate(timeout=30)
    _complete_or_absent(out) if out.exists() else None
    bench = tmp_path / "b.json"
    proc = _ceiling("bench", "--url", sse_url, "--max-tokens", "20", "--requests", "3",
                    "--warmup", "0", "--out", str(bench))  # fmt: skip
    time.sleep(delay)
    proc.kill()
    proc.communicate(timeout=30)
    if bench.exists():
        assert json.loads(bench.read_text())["kind"]
