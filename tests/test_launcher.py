"""The launcher against a fake engine (a small HTTP server that speaks vLLM's CLI and log).

Fast and deterministic: process group, readiness, phases, death classification, teardown
(SIGTERM, SIGKILL after the grace period, port freed), port-in-use and the CLI's bad input.
The real vLLM is exercised in tests/engine/.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from ceiling.cli import main
from ceiling.engines.variant import load_variant
from ceiling.errors import CeilingError
from ceiling.run.launcher import EngineDied, _group_members, port_in_use, start

FAKE = r"""
import http.server, json, os, signal, subprocess, sys, time
args = sys.argv[1:]
assert args[0] == "serve", args
port = int(args[args.index("--port") + 1])
host = args[args.index("--host") + 1]
name = args[args.index("--served-model-name") + 1] if "--served-model-name" in args else args[1]
if "--bogus" in args:
    time.sleep(0.3)
    print("usage: vllm [-h] [-v] {chat,complete,serve} ...", flush=True)
    print("vllm: error: unrecognized arguments: --bogus 1", flush=True)
    sys.exit(2)
if "--ignore-term" in args:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(f"(APIServer pid={os.getpid()}) INFO 11-29 08:58:59 [api_utils.py:286] non-default args: {{'port': {port}}}", flush=True)
print("Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:00<00:00]", flush=True)
time.sleep(0.3)
print("(Worker pid=2) INFO 11-29 08:59:25 [default_loader.py:501] Loading weights took 0.01 seconds", flush=True)
print("(EngineCore pid=1) INFO 11-29 08:59:26 [kv_cache_utils.py:2327] CPU KV cache size: 1,024 tokens, Maximum concurrency for 512 tokens per request: 2.00x", flush=True)
if "--never-ready" in args:
    # a tqdm-style redraw with no newline yet: the launcher still reads its phase
    sys.stdout.write("\rLoading safetensors checkpoint shards:  75% Completed | 3/4 [00:01<00:00]")
    sys.stdout.flush()
    time.sleep(120)
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        body = b"{}"
        if self.path == "/v1/models":
            body = json.dumps({"data": [{"id": name}]}).encode()
        elif self.path != "/health":
            self.send_response(404); self.end_headers(); return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)
srv = http.server.HTTPServer((host, port), H)
print("INFO:     Application startup complete.", flush=True)
srv.serve_forever()
"""


@pytest.fixture
def fake_variant(tmp_path):
    fake = tmp_path / "fake_vllm.py"
    fake.write_text(FAKE)
    model = tmp_path / "model"
    model.mkdir()

    def make(*extra: str, port: int | None = None, name: str = "fake"):
        lines = [
            "engine: vllm",
            f"model: {model}",
            "served_model_name: tiny-fake",
            f"log_dir: {tmp_path / 'logs'}",
            f"command: [{json.dumps(sys.executable)}, {json.dumps(str(fake))}]",
            f"args: {json.dumps(list(extra))}",
            "env: {FAKE_ENV: 'yes'}",
        ]
        if port is not None:
            lines.append(f"port: {port}")
        path = tmp_path / f"{name}.yaml"
        path.write_text("\n".join(lines) + "\n")
        return path

    return make


def test_launch_ready_and_clean_teardown(fake_variant):
    variant = load_variant(fake_variant())
    server = start(variant, timeout_s=60, progress=False)
    try:
        assert server.alive()
        assert server.model == "tiny-fake"  # from /v1/models
        assert server.url == f"http://127.0.0.1:{server.port}"
        assert server.phase == "ready" and server.ready_s is not None
        members = _group_members(server.pid)
        assert server.pid in members and len(members) >= 2  # the fake's child is in our group
        assert os.getpgid(server.pid) == server.pid != os.getpgid(0)
        env = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
        assert b"NO_COLOR=1" in env and b"FAKE_ENV=yes" in env
        meta = json.loads(server.log_path.with_suffix(".launch.json").read_text())
        assert meta["pid"] == server.pid and meta["variant_env"] == {"FAKE_ENV": "yes"}
        assert "Application startup complete." in server.log_path.read_text()
    finally:
        result = server.stop(grace_s=10)
    assert result.signals == ["SIGTERM"]
    assert result.leftover_pids == [] and result.port_free is True
    assert _group_members(server.pid) == []
    assert not port_in_use("127.0.0.1", server.port)


def test_sigkill_after_grace(fake_variant):
    server = start(load_variant(fake_variant("--ignore-term")), timeout_s=60, progress=False)
    result = server.stop(grace_s=1.0)
    assert result.signals == ["SIGTERM", "SIGKILL"]
    assert result.leftover_pids == [] and result.port_free is True


def test_death_is_classified_and_quoted(fake_variant):
    with pytest.raises(EngineDied) as err:
        start(load_variant(fake_variant("--bogus", "1")), timeout_s=60, progress=False)
    died = err.value
    assert died.cause == "argparse unrecognized arguments"
    assert died.death.exit_code == 2
    assert any("unrecognized arguments: --bogus 1" in ln for ln in died.evidence)
    assert "preflight" in (died.fix or "")


def test_timeout_stops_the_server(fake_variant):
    variant = load_variant(fake_variant("--never-ready"))
    with pytest.raises(CeilingError, match="not ready after") as err:
        start(variant, timeout_s=3, progress=False)
    assert "loading weights 3/4 shards" in err.value.message  # unfinished tqdm line


def test_port_in_use_is_refused_before_launch(fake_variant):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(CeilingError, match="already in use") as err:
            start(load_variant(fake_variant(port=port)), timeout_s=10, progress=False)
        assert "port" in (err.value.fix or "")


def test_cli_launch_exit_when_ready(fake_variant, capsys):
    rc = main(["launch", str(fake_variant()), "--skip-preflight", "--exit-when-ready", "--json"])
    assert rc == 0
    info = json.loads(capsys.readouterr().out)
    assert info["model"] == "tiny-fake" and info["engine"] == "vllm"
    assert not port_in_use("127.0.0.1", info["port"])


def test_cli_launch_death_is_one_line_error(fake_variant, capsys):
    rc = main(["launch", str(fake_variant("--bogus", "1")), "--skip-preflight", "--json"])
    assert rc == 3
    err = capsys.readouterr().err
    assert "engine died (exit code 2): argparse unrecognized arguments" in err
    assert "Traceback" not in err


# ---- bad input through the CLI: one line + fix, non-zero, no traceback --------------------


def _cli_error(argv, capsys) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc != 0
    assert err.startswith("error: ") and "fix: " in err and "Traceback" not in err
    return err


def test_bad_input_missing_model_path(tmp_path, capsys):
    p = tmp_path / "v.yaml"
    p.write_text("engine: vllm\nmodel: ./no-such-model\n")
    err = _cli_error(["launch", str(p), "--skip-preflight"], capsys)
    assert "model path not found" in err


def test_bad_input_unknown_engine(tmp_path, capsys):
    p = tmp_path / "v.yaml"
    p.write_text("engine: warp-drive\nmodel: org/m\n")
    assert "unknown engine 'warp-drive'" in _cli_error(["preflight", str(p)], capsys)


def test_bad_input_malformed_variant(tmp_path, capsys):
    p = tmp_path / "v.yaml"
    p.write_text("engine: vllm\nmodel: {unclosed\n")
    assert "malformed variant file" in _cli_error(["preflight", str(p)], capsys)


def test_bad_input_engine_not_installed(tmp_path, capsys):
    p = tmp_path / "v.yaml"
    p.write_text(f"engine: sglang\nmodel: org/m\npython: {tmp_path / 'nope' / 'python'}\n")
    assert "is not installed" in _cli_error(["preflight", str(p)], capsys)


def test_bad_input_port_in_use(fake_variant, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        err = _cli_error(["launch", str(fake_variant(port=port)), "--skip-preflight"], capsys)
    assert f"port {port}" in err and "already in use" in err


def test_port_checks_ipv4_and_ipv6():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_in_use("127.0.0.1", port) and port_in_use("0.0.0.0", port)
    assert not port_in_use("127.0.0.1", port)
    if socket.has_ipv6:
        try:
            with socket.socket(socket.AF_INET6) as s6:
                s6.bind(("::1", 0))
                s6.listen()
                assert port_in_use("::1", s6.getsockname()[1])
        except OSError:
            pytest.skip("no IPv6 loopback here")


def test_shm_note_only_when_nearly_full(tmp_path, monkeypatch):
    from ceiling.run import launcher

    monkeypatch.setattr(launcher, "SHM_LOW_BYTES", 1 << 62)  # everything counts as nearly full
    (tmp_path / "psm_stale").write_bytes(b"x")
    note = launcher._shm_note(tmp_path)
    assert note and "1 stale engine segment" in note and "ceiling shm --apply" in note
    monkeypatch.setattr(launcher, "SHM_LOW_BYTES", 0)
    assert launcher._shm_note(tmp_path) is None


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_killing_ceiling_launch_tears_the_engine_down(fake_variant, signame):
    """`kill <ceiling launch>` (or Ctrl-C, which shells ignore for background jobs) must not
    orphan the engine: the launcher's teardown runs and the port is freed."""
    import signal
    import subprocess
    import time

    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ceiling",
            "launch",
            "--skip-preflight",
            str(fake_variant(port=port)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # a background job: SIGINT arrives ignored, as under `ceiling launch ... &`
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    deadline = time.monotonic() + 60
    while not port_in_use("127.0.0.1", port):
        assert proc.poll() is None and time.monotonic() < deadline, "fake engine never came up"
        time.sleep(0.1)
    time.sleep(0.5)  # past readiness, into the serve loop
    proc.send_signal(getattr(signal, signame))
    out, _ = proc.communicate(timeout=60)
    assert "stopped" in out and "port free" in out, out
    assert not port_in_use("127.0.0.1", port)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_secret_flag_values_never_reach_the_launch_record():
    from ceiling.run.launcher import redact_argv

    argv = ["python", "-c", "line1\nline2", "serve", "m", "--api-key", "sk-123", "--hf-token=hf_x"]
    assert redact_argv(argv) == [
        "python", "-c", "<shim>", "serve", "m", "--api-key", "***", "--hf-token=***",
    ]  # fmt: skip
