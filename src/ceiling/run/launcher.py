"""Start an engine server from a variant, watch it come up, and tear it down cleanly.

Why it is careful:
- the server runs in its own session/process group (``start_new_session``), so teardown can
  signal the whole tree (API server, engine core, workers) and nothing else;
- teardown signals only a group that we created and that still has members in our session
  (checked in /proc): a recycled PID is never signalled;
- readiness is the engine's health endpoints (or its ready line), and a death is explained from
  the log (``ceiling.engines.death``) instead of a bare exit code;
- the port is checked before launching (a clear error instead of a 40-second start-up that dies
  with ``Address already in use``) and after teardown (the next variant needs it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ceiling.errors import CeilingError

if TYPE_CHECKING:
    from ceiling.engines.base import Engine
    from ceiling.engines.death import DeathCause
    from ceiling.engines.variant import Variant

SECRET_HINTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
# Health checks talk to our own server: never through an HTTP(S)_PROXY from the environment.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EngineDied(CeilingError):
    """The server process exited before it was ready (or while serving)."""

    def __init__(self, death: DeathCause, log_path: Path, variant: str) -> None:
        quoted = "\n".join(f"    | {ln}" for ln in death.evidence)
        message = (
            f"{variant}: engine died (exit code {death.exit_code}): {death.cause}"
            + (f"\n{quoted}" if quoted else "")
            + f"\n  log: {log_path}"
        )
        super().__init__(message, fix=death.fix, exit_code=3)
        self.death = death
        self.cause = death.cause
        self.evidence = death.evidence
        self.log_path = log_path


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_in_use(host: str, port: int) -> bool:
    """True when something accepts connections on ``host:port`` or a server could not bind it."""
    host = host or "127.0.0.1"
    probe = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    with socket.socket(_family(probe), socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        if s.connect_ex((probe, port)) == 0:
            return True
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        # SO_REUSEADDR as servers set it: connections left in TIME_WAIT do not block a restart
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (there is a small race; launch re-checks)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _group_members(pgid: int) -> list[int]:
    """PIDs whose process group AND session are ``pgid`` (i.e. the session we created)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # fields after the ")" of the command name: state ppid pgrp session ...
        rest = stat.rsplit(")", 1)[-1].split()
        if len(rest) > 3 and int(rest[2]) == pgid and int(rest[3]) == pgid:
            members.append(int(entry.name))
    return members


class Server:
    """A running engine server that this process started (and alone may stop)."""

    def __init__(
        self,
        variant: Variant,
        engine: Engine,
        proc: subprocess.Popen[bytes],
        port: int,
        log_path: Path,
        notes: list[str],
    ) -> None:
        self.variant = variant
        self.engine = engine
        self.proc = proc
        self.port = port
        self.host = variant.host
        self.log_path = log_path
        self.notes = notes
        self.model = variant.served_model_name or variant.model
        self.pid = proc.pid
        self.started_at = time.monotonic()
        self.ready_s: float | None = None
        self.phase = "starting"
        self._log_pos = 0
        self._ready_line_seen = False

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def _read_new(self) -> tuple[list[str], str]:
        """Complete new log lines, and the unfinished last one (tqdm redraws it with \r)."""
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(self._log_pos)
                data = fh.read()
        except OSError:
            return [], ""
        cut = data.rfind(b"\n")
        partial = data[cut + 1 :].decode("utf-8", errors="replace").split("\r")[-1]
        if cut < 0:
            return [], partial
        self._log_pos += cut + 1
        text = data[: cut + 1].decode("utf-8", errors="replace")
        # progress bars rewrite one line with \r: keep each state
        return [p for ln in text.splitlines() for p in ln.split("\r") if p.strip()], partial

    def _http_ok(self, path: str) -> bytes | None:
        try:
            with _NO_PROXY.open(self.url + path, timeout=2) as resp:
                return resp.read() if resp.status == 200 else None
        except (urllib.error.URLError, OSError, TimeoutError):
            return None

    def _check_ready(self) -> bool:
        """Ready when every health path answers 200; the served name comes from /v1/models."""
        bodies = {}
        for path in self.engine.health_paths:
            body = self._http_ok(path)
            if body is None:
                return False
            bodies[path] = body
        models = bodies.get("/v1/models")
        if models:
            with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
                self.model = json.loads(models)["data"][0]["id"]
        return True

    def death(self) -> DeathCause:
        from ceiling.engines.death import classify_death

        return classify_death(self.log_lines(), self.proc.poll(), self.engine.name)

    def wait_ready(self, timeout_s: float, progress: bool = True) -> None:
        """Poll log + endpoints until ready; raise EngineDied on exit, CeilingError on timeout."""
        from ceiling.console import console

        deadline = self.started_at + timeout_s
        status = console().status(f"{self.variant.name}: starting") if progress else None
        if status is not None:
            status.start()
        try:
            last_http = 0.0
            while True:
                lines, partial = self._read_new()
                for line in [*lines, partial]:
                    phase = self.engine.phase_of(line) if line.strip() else None
                    if phase:
                        self.phase = phase
                    if self.engine.ready_line and self.engine.ready_line in line:
                        self._ready_line_seen = True
                if self.proc.poll() is not None:
                    raise EngineDied(self.death(), self.log_path, self.variant.name)
                now = time.monotonic()
                # The endpoints are polled once a second; at once after the ready line.
                if (self._ready_line_seen or now - last_http >= 1.0) and self._check_ready():
                    self.ready_s = now - self.started_at
                    self.phase = "ready"
                    return
                last_http = now if now - last_http >= 1.0 else last_http
                if now > deadline:
                    self.stop()
                    raise CeilingError(
                        f"{self.variant.name}: not ready after {timeout_s:.0f} s "
                        f"(last phase: {self.phase}); stopped it. log: {self.log_path}",
                        fix="raise --timeout (large models load for many minutes) or read the log",
                        exit_code=3,
                    )
                if status is not None:
                    status.update(
                        f"{self.variant.name}: {self.phase} ({now - self.started_at:.0f} s)"
                    )
                time.sleep(0.25)
        finally:
            if status is not None:
                status.stop()

    def stop(self, grace_s: float = 20.0) -> dict[str, object]:
        """SIGTERM our process group, SIGKILL after ``grace_s``, then confirm the port is free."""
        pgid = self.proc.pid
        signalled = []
        if _group_members(pgid) or self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
                signalled.append("SIGTERM")
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            self.proc.poll()
            if not _group_members(pgid):
                break
            time.sleep(0.2)
        else:
            if _group_members(pgid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
                    signalled.append("SIGKILL")
                end = time.monotonic() + 5
                while _group_members(pgid) and time.monotonic() < end:
                    time.sleep(0.1)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        port_free = False
        end = time.monotonic() + 10
        while time.monotonic() < end:
            if not port_in_use(self.host, self.port):
                port_free = True
                break
            time.sleep(0.2)
        return {
            "signals": signalled,
            "exit_code": self.proc.returncode,
            "leftover_pids": _group_members(pgid),
            "port_free": port_free,
        }

    def info(self) -> dict[str, object]:
        """What a caller (or --json) needs to use the server."""
        return {
            "variant": self.variant.name,
            "engine": self.engine.name,
            "url": self.url,
            "model": self.model,
            "pid": self.pid,
            "port": self.port,
            "log_path": str(self.log_path),
            "ready_s": None if self.ready_s is None else round(self.ready_s, 2),
            "notes": self.notes,
        }


SHM_LOW_BYTES = 1 << 30  # heuristic: below 1 GiB free, multi-process engines and NCCL fail


def _shm_note(root: Path = Path("/dev/shm")) -> str | None:
    """A warning when /dev/shm is nearly full (engines then die with a bus error)."""
    try:
        st = os.statvfs(root)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free >= SHM_LOW_BYTES:
        return None
    from ceiling.run.shm import scan

    stale = [seg for seg in scan(root).segments if seg.stale]
    return (
        f"/dev/shm has only {free / 2**20:.0f} MiB free ({len(stale)} stale engine segment(s): "
        "`ceiling shm --apply` removes them; containers need --shm-size or --ipc=host)"
    )


def _redact(env: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if any(h in k.upper() for h in SECRET_HINTS) else v) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
    """The command line with secret-looking flag values masked (``--api-key X``,
    ``--hf-token=X``) and the inline shim script shortened, for files a user keeps."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next:
            out.append("***")
            mask_next = False
            continue
        name, eq, _value = arg.partition("=")
        secret = arg.startswith("-") and any(
            h in name.upper().replace("-", "_") for h in SECRET_HINTS
        )
        if secret and eq:
            out.append(f"{name}=***")
        elif secret:
            out.append(arg)
            mask_next = True
        else:
            out.append(arg if "\n" not in arg else "<shim>")
    return out


def start(
    variant: Variant,
    timeout_s: float = 1800.0,
    progress: bool = True,
    wait: bool = True,
) -> Server:
    """Start ``variant``'s server and (by default) wait until it is ready. Caller must stop it."""
    from ceiling.engines import get_engine

    engine = get_engine(variant.engine)
    model_path = variant.model_path()
    if model_path is not None and not model_path.exists():
        raise CeilingError(
            f"{variant.name}: model path not found: {model_path}",
            fix="fix `model:` in the variant (a local directory with config.json, or a hub id)",
        )
    install = engine.locate(variant)
    port = variant.port if variant.port is not None else free_port(variant.host)
    if port_in_use(variant.host, port):
        raise CeilingError(
            f"{variant.name}: port {port} on {variant.host} is already in use",
            fix="stop whatever listens there, or set another `port:` in the variant",
        )
    plan = engine.launch_command(variant, install, port)
    shm_note = _shm_note()
    if shm_note:
        plan.notes.append(shm_note)
    env = dict(os.environ)
    env.update(variant.env)
    env.update(plan.env)
    env["NO_COLOR"] = "1"
    log_dir = Path(variant.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    log_path = (log_dir / f"{variant.name}-{stamp}-{port}.log").resolve()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            plan.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    meta = {
        "schema_version": 1,
        "variant": variant.name,
        "engine": engine.name,
        "engine_version": install.version,
        "argv": redact_argv(plan.argv),
        "variant_env": _redact(variant.env),
        "pid": proc.pid,
        "port": port,
        "notes": plan.notes,
        "started": stamp,
    }
    log_path.with_suffix(".launch.json").write_text(json.dumps(meta, indent=2) + "\n")
    server = Server(variant, engine, proc, port, log_path, plan.notes)
    if wait:
        try:
            server.wait_ready(timeout_s, progress=progress)
        except BaseException:
            if server.alive() or _group_members(server.pid):
                server.stop()
            raise
    return server


@contextlib.contextmanager
def launch(variant: Variant, timeout_s: float = 1800.0, progress: bool = True) -> Iterator[Server]:
    """Context manager: a ready server for the ``with`` body, torn down afterwards."""
    server = start(variant, timeout_s=timeout_s, progress=progress)
    try:
        yield server
    finally:
        server.stop()


def run_launch(
    path: Path,
    timeout_s: float = 1800.0,
    port: int | None = None,
    exit_when_ready: bool = False,
    skip_preflight: bool = False,
    json_out: bool = False,
) -> int:
    """``ceiling launch``: preflight, start, wait for readiness, serve until interrupted."""
    from ceiling.console import console, emit_json
    from ceiling.engines.variant import load_variant

    variant = load_variant(path)
    if port is not None:
        variant = variant.with_overrides(port=port)
    if not skip_preflight:
        from ceiling.engines.preflight import preflight

        with console().status(f"{variant.name}: preflight"):
            report = preflight(variant)
        if not report.ok:
            first = report.errors[0]
            raise CeilingError(
                f"{variant.name}: preflight failed: {first.message}"
                + (f" (+{len(report.errors) - 1} more)" if len(report.errors) > 1 else ""),
                fix=first.fix or "run `ceiling preflight` for the full list",
            )
    server = start(variant, timeout_s=timeout_s, progress=not json_out)
    info = server.info()
    if json_out:
        emit_json(info)
    else:
        for note in server.notes:
            console().print(f"note: {note}")
        console().print(
            f"[green]ready[/green] {variant.name} at {server.url} (model {server.model!r}) "
            f"in {server.ready_s:.1f} s; log: {server.log_path}"
        )
    try:
        if not exit_when_ready:
            console().print("serving; Ctrl-C stops it")
            while server.alive():
                time.sleep(1.0)
            raise EngineDied(server.death(), server.log_path, variant.name)
    except KeyboardInterrupt:
        pass
    finally:
        result = server.stop()
        if not json_out:
            console().print(
                f"stopped {variant.name}: signals {result['signals'] or 'none'}, "
                f"port {'free' if result['port_free'] else 'STILL IN USE'}"
            )
    return 0
