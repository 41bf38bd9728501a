"""A fake engine (speaks vLLM's command line and log) for the fast interrupt/key/readiness tests.

Behaviours, by flag: ``--ignore-term`` (ignores SIGTERM, as vLLM's API server does while its
engine core starts), ``--never-ready`` (loads forever), ``--api-key K`` (``/v1/models`` wants
``Authorization: Bearer K``; ``/health`` is open, as in vLLM; or ``VLLM_API_KEY``), ``--hidden-key K`` (the same, but
the key comes from somewhere ceiling cannot see). It always starts a child process in its group
(like vLLM's EngineCore), which also ignores SIGTERM with ``--ignore-term``. ``--die-at-start``
exits 1 before it listens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SCRIPT = r"""
import http.server, json, os, signal, subprocess, sys, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
host = args[args.index("--host") + 1]
key = os.environ.get("VLLM_API_KEY")  # as vLLM: the flag wins over the variable
for flag in ("--api-key", "--hidden-key"):
    if flag in args:
        key = args[args.index(flag) + 1]
ignore = "--ignore-term" in args
if "--die-at-start" in args:
    print("ValueError: the fake engine dies at start-up", flush=True)
    sys.exit(1)
if ignore:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time\n"
    + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore else "")
    + "time.sleep(600)"])
print(f"(APIServer pid={os.getpid()}) INFO non-default args: {{'port': {port}}}", flush=True)
print("Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:00<00:00]", flush=True)
if "--never-ready" in args:
    time.sleep(600)
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        print("GET", self.path, a[1] if len(a) > 1 else "", flush=True)
    def do_GET(self):
        if self.path.startswith("/v1/") and key and self.headers.get("Authorization") != f"Bearer {key}":
            self.send_response(401); self.end_headers(); return
        body = b"{}"
        if self.path == "/v1/models":
            body = json.dumps({"data": [{"id": "fake"}]}).encode()
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


def write_variant(tmp: Path, *flags: str, name: str = "fake", env: dict | None = None) -> Path:
    """A variant file that launches the fake engine with ``flags``."""
    script = tmp / "fake_engine_server.py"
    script.write_text(SCRIPT)
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    lines = [
        "engine: vllm",
        f"model: {model}",
        f"log_dir: {tmp / 'logs'}",
        f"command: [{json.dumps(sys.executable)}, {json.dumps(str(script))}]",
        f"args: {json.dumps(list(flags))}",
    ]
    if env:
        lines.append(f"env: {json.dumps(env)}")
    path = tmp / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path
