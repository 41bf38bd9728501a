"""Interrupts, a killed ceiling, API keys, readiness and /dev/shm against real vLLM (CPU build).

Two launches of their own (vLLM 0.32 CPU: 25-100 s each on the 2-core test machine) plus the
shared session server:

- a variant with ``--api-key``: readiness polls with the key (``/v1/models`` answers 401 without
  it); vLLM's shared-memory segments are held by its processes and ``shm`` never calls them
  stale, through the ``/run/shm`` symlink too; then ``ceiling launch`` is SIGKILLed and the
  watchdog ends the whole vLLM group (API server, EngineCore, worker, resource tracker);
- Ctrl-C while vLLM's engine core starts (its API server ignores SIGTERM then): exit 130,
  ``stopping ...``, every process gone (SIGKILL after the 5 s grace when SIGTERM is ignored);
- ``doctor --url`` on the shared server, Ctrl-C during the single-stream bench: doctor.json is
  written with ``interrupted: true``, exit 130, and the server it did not start keeps running.

No test asserts a duration; each prints the seconds from the signal to the last process gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ceiling.run import guard, shm
from ceiling.run.launcher import port_in_use

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
CPU_TINY = REPO / "examples" / "variants" / "cpu-tiny.yaml"
START_S = 600  # vLLM start-up on a busy 2-core machine: 35-100 s; generous bound


def _variant(tmp: Path, model: Path, extra_args: dict | None = None) -> Path:
    lines = [f"extends: {CPU_TINY}", f"model: {model}", f"log_dir: {tmp / 'logs'}"]
    if extra_args:
        lines.append("args: " + json.dumps(extra_args))
    path = tmp / "variant.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _ceiling(*argv: str, state: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ceiling", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CEILING_STATE_DIR": str(state)},
        start_new_session=True,
    )


class _Stderr:
    """Collects a process's stderr lines in a thread (so a test can wait for one)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.lines.append(line)

    def has(self, text: str) -> bool:
        return any(text in ln for ln in self.lines)

    @property
    def text(self) -> str:
        self._thread.join(timeout=10)
        return "".join(self.lines)


def _until(cond, what: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.2)


def _record(state: Path, proc: subprocess.Popen[str]) -> guard.ServerRecord:
    def there() -> bool:
        assert proc.poll() is None, proc.communicate()
        return any(state.glob("*.json"))

    _until(there, "the server record", 120)
    return guard.ServerRecord.model_validate_json(next(state.glob("*.json")).read_text())


def _status(url: str, key: str | None = None) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0


def test_api_key_readiness_shm_and_sigkilled_ceiling(tiny_model_dir, tmp_path):
    key = "sk-engine-test-5150"
    state = tmp_path / "state"
    proc = _ceiling(
        "launch",
        "--skip-preflight",
        str(_variant(tmp_path, tiny_model_dir, {"api-key": key})),
        state=state,
    )
    err = _Stderr(proc)
    rec = _record(state, proc)
    base = f"http://127.0.0.1:{rec.port}"
    # ceiling's readiness (polling with the variant's key) says "ready", not a timeout
    _until(lambda: err.has("serving; Ctrl-C stops it") or proc.poll() is not None, "ready", START_S)
    try:
        assert not err.has("requires an API key") and err.has("ready"), err.text
        assert _status(base + "/v1/models", key) == 200
        assert _status(base + "/v1/models") == 401  # the key is required ...
        assert _status(base + "/health") == 200  # ... and /health is open, as readiness saw
        members = guard.group_members(rec.pid)
        assert len(members) >= 3, members  # API server, EngineCore, worker (+ tracker)

        # /dev/shm: vLLM's own segments are in use, never stale, through /run/shm as well
        roots = [Path("/dev/shm")] + ([Path("/run/shm")] if Path("/run/shm").is_symlink() else [])
        for root in roots:
            held = [s for s in shm.scan(root).segments if set(s.in_use_by) & set(members)]
            assert held, f"no segment of vLLM's processes found under {root}"
            for seg in held:
                assert not seg.stale
                assert "in use" in (shm._recheck(seg) or ""), seg  # --apply would skip it
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # ceiling dies without any teardown of its own
        t0 = time.monotonic()
        proc.wait(timeout=60)
    _until(lambda: guard.group_members(rec.pid) == [], "the watchdog to end vLLM", 60)
    print(f"vLLM group gone {time.monotonic() - t0:.1f} s after ceiling's SIGKILL")
    _until(lambda: not port_in_use("127.0.0.1", rec.port), "the port to be free", 30)
    logs = list((tmp_path / "logs").glob("*"))
    assert logs and all(key not in p.read_text(errors="replace") for p in logs)


def test_ctrl_c_while_vllm_starts(tiny_model_dir, tmp_path):
    state = tmp_path / "state"
    proc = _ceiling(
        "launch", "--skip-preflight", str(_variant(tmp_path, tiny_model_dir)), state=state
    )
    rec = _record(state, proc)
    # the engine core is starting: the phase in which vLLM's API server ignores SIGTERM
    _until(lambda: len(guard.group_members(rec.pid)) >= 2, "EngineCore to start", START_S)
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=120)
    print(f"launch returned {time.monotonic() - t0:.1f} s after Ctrl-C")
    assert proc.returncode == 130, err
    assert "stopping" in err and "Traceback" not in err, err
    if "SIGKILL" in err:
        assert "still running" in err and "starting up" in err, err
    assert guard.group_members(rec.pid) == []
    assert not port_in_use("127.0.0.1", rec.port)


def test_doctor_ctrl_c_writes_what_it_has(vllm_server, tmp_path):
    out = tmp_path / "doctor"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "ceiling", "doctor",
            "--url", vllm_server.url, "--log", str(vllm_server.log_path),
            "--model", str(vllm_server.variant.model),
            "--max-tokens", "256", "--repeat", "5", "--concurrency", "1,2",
            "--no-telemetry", "--no-measure-cpu", "--out-dir", str(out),
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    seen: list[str] = []
    started = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if "bench single" in line:
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert started.wait(300), "".join(seen)
    time.sleep(3.0)  # some requests into the single-stream bench
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    err = "".join(seen)
    assert proc.returncode == 130, err
    assert "stopping" in err and "Traceback" not in err, err
    doc = json.loads((out / "doctor.json").read_text())
    assert doc["interrupted"] is True
    stages = {s["name"]: s["status"] for s in doc["stages"]}
    assert stages.get("bench single") == "interrupted", stages
    assert "bench concurrency" not in stages  # it stopped instead of carrying on
    assert doc["bench"]["single"]["partial"] is True  # what was measured is kept
    assert (out / "report.md").is_file()
    assert vllm_server.alive()  # doctor --url never stops a server it did not start
