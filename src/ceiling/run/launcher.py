"""Start an engine server from a variant, watch it come up, and tear it down cleanly.

Why it is careful:
- the server runs in its own session/process group (``start_new_session``), so teardown can
  signal the whole tree (API server, engine core, workers) and nothing else;
- teardown signals only a group that we created and that still has members in our session
  (checked in /proc): a recycled PID is never signalled;
- readiness is the engine's health endpoints (or its ready line), and a death is explained from
  the log (``ceiling.engines.death``) instead of a bare exit code;
- the port is checked before launching (a clear error instead of a 40-second start-up that dies
  with ``Address already in use``) and after teardown (the next variant needs it);
- readiness polls with the API key the variant configures; a 401/403 there means "ready, but
  requests need a key" (said once, clearly), not "still loading";
- an interrupt stops the engine at once (``stopping ...``), and an engine that ignores SIGTERM
  (vLLM's API server does while its engine core starts) gets SIGKILL after a short grace;
- the engine never outlives ceiling silently: a watchdog ends it when ceiling dies, even by
  SIGKILL, and a record lets ``ceiling stop`` find it if the watchdog died too (``guard.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel

from ceiling import interrupts
from ceiling.console import Progress, say
from ceiling.engines import get_engine
from ceiling.engines.base import Engine
from ceiling.engines.death import DeathCause, classify_death
from ceiling.engines.variant import Variant
from ceiling.errors import CeilingError, ExitStatus
from ceiling.outputs import safe_name, write_atomic
from ceiling.redact import redact_argv, redact_env
from ceiling.run import guard
from ceiling.run.guard import group_members as _group_members
from ceiling.run.ports import check_port, free_port, port_in_use
from ceiling.run.shm import scan
from ceiling.server.sync import SyncClient

__all__ = ["EngineDied", "Server", "free_port", "launch", "port_in_use", "redact_argv", "start"]

#: SIGTERM -> SIGKILL grace of a server that never became ready, or after an interrupt: vLLM's
#: API server ignores SIGTERM while its engine core starts, and a user waits for us.
QUICK_GRACE_S = 5.0
#: Without a terminal, a phase line at least this often while the engine starts.
HEARTBEAT_S = 30.0


class ServerInfo(BaseModel):
    """A ready server: where it answers, what it serves, where its log is."""

    variant: str
    engine: str
    url: str
    model: str
    pid: int
    port: int
    log_path: str
    ready_s: float | None
    needs_api_key: bool
    notes: list[str]


class StopResult(BaseModel):
    """How a server went: the signals sent, its exit code, what is left, whether its port is
    free again."""

    signals: list[str]
    exit_code: int | None
    leftover_pids: list[int]
    port_free: bool


class EngineDied(CeilingError):
    """The server process exited before it was ready (or while serving)."""

    def __init__(self, death: DeathCause, log_path: Path, variant: str) -> None:
        quoted = "\n".join(f"    | {ln}" for ln in death.evidence)
        message = (
            f"{variant}: engine died (exit code {death.exit_code}): {death.cause}"
            + (f"\n{quoted}" if quoted else "")
            + f"\n  log: {log_path}"
        )
        super().__init__(message, fix=death.fix, exit_code=ExitStatus.ENGINE)
        self.death = death
        self.cause = death.cause
        self.evidence = death.evidence
        self.log_path = log_path


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
        api_key: str | None = None,
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
        self.api_key = api_key
        self.needs_key = False  # a 401/403 on an API path: requests must carry a key
        self.started_at = time.monotonic()
        self.ready_s: float | None = None
        self.phase = "starting"
        self.watchdog: subprocess.Popen[bytes] | None = None
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

    def _http_get(self, path: str) -> tuple[int | None, bytes | None]:
        """(HTTP status, body) of GET ``path`` with the server's own API key (not the
        environment's: a 401 then says the variant names none); (None, None): no answer.
        The server is ours, on this host: never through a proxy (ceiling.server.policy)."""
        client = SyncClient(self.url, key=self.api_key, env_key=False, direct=True)
        return client.get(path, timeout_s=2)

    def _check_ready(self) -> bool:
        """Ready when every health path answers 200, or 401/403 on an API path (``/v1/...``:
        the server is up and wants a key); the served name comes from /v1/models."""
        bodies = {}
        for path in self.engine.health_paths:
            status, body = self._http_get(path)
            if status in (401, 403) and path.startswith("/v1/"):
                self.needs_key = True
                continue
            if status != 200 or body is None:
                return False
            bodies[path] = body
        models = bodies.get("/v1/models")
        if models:
            with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
                self.model = json.loads(models)["data"][0]["id"]
        return True

    def key_note(self) -> str | None:
        """What to tell the user when the server answered 401/403 (None: it did not)."""
        if not self.needs_key:
            return None
        if self.api_key:
            return (
                f"{self.variant.name} refused the API key the variant configures (HTTP 401/403 "
                "on /v1/models): check `--api-key` / the key variable in the variant"
            )
        return (
            f"{self.variant.name} is ready but requires an API key (HTTP 401/403 on /v1/models) "
            "that the variant does not name: set CEILING_API_KEY to it for bench/doctor"
        )

    def death(self) -> DeathCause:
        return classify_death(self.log_lines(), self.proc.poll(), self.engine.name)

    def wait_ready(
        self, timeout_s: float, progress: bool = True, timeout_option: str = "--ready-timeout"
    ) -> None:
        """Poll log + endpoints until ready; raise EngineDied on exit, CeilingError on timeout.

        With ``progress``, a terminal shows a live status line; without a terminal (CI, nohup,
        a log file) each new phase is printed as a line, and the current one every 30 s.
        """
        deadline = self.started_at + timeout_s
        with Progress(
            f"{self.variant.name}: starting", enabled=progress, lines=True, heartbeat_s=HEARTBEAT_S
        ) as shown:
            last_http = 0.0
            while True:
                lines, partial = self._read_new()
                now = time.monotonic()
                for line in [*lines, partial]:
                    phase = self.engine.phase_of(line) if line.strip() else None
                    if phase and phase != self.phase:
                        self.phase = phase
                        # Without a terminal every phase the log went through gets its line,
                        # even when several (or the ready line) arrive in one read.
                        shown.update(self._phase_line(now), key=phase)
                    if self.engine.ready_line and self.engine.ready_line in line:
                        self._ready_line_seen = True
                shown.update(self._phase_line(now), key=self.phase)  # live line, or heartbeat
                if self.proc.poll() is not None:
                    raise EngineDied(self.death(), self.log_path, self.variant.name)
                # The endpoints are polled once a second; at once after the ready line.
                if (self._ready_line_seen or now - last_http >= 1.0) and self._check_ready():
                    self.ready_s = now - self.started_at
                    self.phase = "ready"
                    return
                last_http = now if now - last_http >= 1.0 else last_http
                if now > deadline:
                    self.stop(grace_s=QUICK_GRACE_S)
                    raise CeilingError(
                        f"{self.variant.name}: not ready after {timeout_s:.0f} s "
                        f"(last phase: {self.phase}); stopped it. log: {self.log_path}",
                        fix=f"raise {timeout_option} (large models load for many minutes) "
                        "or read the log",
                        exit_code=ExitStatus.ENGINE,
                    )
                time.sleep(0.25)

    def _phase_line(self, now: float) -> str:
        return f"{self.variant.name}: {self.phase} ({now - self.started_at:.0f} s)"

    def stop(self, grace_s: float = 20.0) -> StopResult:
        """SIGTERM our process group, SIGKILL after ``grace_s``, then confirm the port is free.

        After an interrupt, or for a server that never became ready, the grace is at most
        QUICK_GRACE_S; a further Ctrl-C meanwhile sends SIGKILL at once. Signals cannot
        abort the teardown (``interrupts.shielded``). What happens is said on stderr.
        """
        with interrupts.shielded():
            result = self._stop(grace_s)
        if self.watchdog is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self.watchdog.terminate()
                self.watchdog.wait(timeout=5)
        if not result.leftover_pids:
            guard.remove_record(self.pid)
        return result

    def _stop(self, grace_s: float) -> StopResult:
        pgid = self.proc.pid
        quick = interrupts.requested() is not None or self.ready_s is None
        grace = min(grace_s, QUICK_GRACE_S) if quick else grace_s
        signalled = []
        if _group_members(pgid) or self.proc.poll() is None:
            if interrupts.requested() is not None:
                say(f"stopping {self.variant.name} (pid {pgid}) ...")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
                signalled.append("SIGTERM")
        deadline = time.monotonic() + grace
        while _group_members(pgid) and time.monotonic() < deadline and not interrupts.hurry():
            self.proc.poll()
            time.sleep(0.1)
        if _group_members(pgid):
            waited = grace - max(0.0, deadline - time.monotonic())
            say(
                f"{self.variant.name} (pid {pgid}) still running {waited:.0f} s after SIGTERM"
                + (" (starting up)" if self.ready_s is None else "")
                + ": sending SIGKILL"
            )
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
                signalled.append("SIGKILL")
            end = time.monotonic() + 5
            while _group_members(pgid) and time.monotonic() < end:
                time.sleep(0.1)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        port_free = False
        end = time.monotonic() + (2 if interrupts.requested() is not None else 10)
        while time.monotonic() < end:
            if not port_in_use(self.host, self.port):
                port_free = True
                break
            time.sleep(0.2)
        return StopResult(
            signals=signalled,
            exit_code=self.proc.returncode,
            leftover_pids=_group_members(pgid),
            port_free=port_free,
        )

    def info(self) -> ServerInfo:
        """What a caller (or --json) needs to use the server."""
        return ServerInfo(
            variant=self.variant.name,
            engine=self.engine.name,
            url=self.url,
            model=self.model,
            pid=self.pid,
            port=self.port,
            log_path=str(self.log_path),
            ready_s=None if self.ready_s is None else round(self.ready_s, 2),
            needs_api_key=self.needs_key,
            notes=self.notes,
        )


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
    stale = [seg for seg in scan(root).segments if seg.stale]
    return (
        f"/dev/shm has only {free / 2**20:.0f} MiB free ({len(stale)} stale engine segment(s): "
        "`ceiling shm --apply` removes them; containers need --shm-size or --ipc=host)"
    )


def start(
    variant: Variant,
    timeout_s: float = 1800.0,
    progress: bool = True,
    wait: bool = True,
    timeout_option: str = "--ready-timeout",
) -> Server:
    """Start ``variant``'s server and (by default) wait until it is ready. Caller must stop it.

    ``timeout_option`` is the option the caller's user raises when the wait times out.
    """
    engine = get_engine(variant.engine)
    check_port(variant.port, "port")
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
    # every process of the engine inherits it: what proves a group ours later (guard.py)
    token = env[guard.TOKEN_ENV] = guard.new_token()
    key = engine.api_key(variant, env)
    log_dir = Path(variant.log_dir)
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CeilingError(
            f"{variant.name}: cannot create the log directory {log_dir}: {exc.strerror}",
            fix="set `log_dir:` in the variant to a writable directory",
        ) from None
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    log_path = (log_dir / f"{safe_name(variant.name)}-{stamp}-{port}.log").resolve()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            plan.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    server = Server(variant, engine, proc, port, log_path, plan.notes, api_key=key)
    try:
        _guard(server, token)
        meta = {
            "schema_version": 1,
            "variant": variant.name,
            "engine": engine.name,
            "engine_version": install.version,
            "argv": redact_argv(plan.argv),
            "variant_env": redact_env(variant.env),
            "pid": proc.pid,
            "port": port,
            "watchdog_pid": server.watchdog.pid if server.watchdog else None,
            "notes": plan.notes,
            "started": stamp,
        }
        write_atomic(
            log_path.with_suffix(".launch.json"),
            json.dumps(meta, indent=2) + "\n",
            what="launch record",
        )
        if wait:
            server.wait_ready(timeout_s, progress=progress, timeout_option=timeout_option)
    except BaseException:
        # every way out of a start that did not come up: the group stopped (if it still
        # runs), the watchdog ended, the record removed (an engine that died at start-up too)
        server.stop()
        raise
    return server


def _guard(server: Server, token: str) -> None:
    """The watchdog and the record that keep the engine from outliving us (``guard.py``)."""
    server.watchdog = guard.spawn_watchdog(server.pid, token)
    guard.write_record(
        guard.ServerRecord(
            pid=server.pid,
            leader_start=guard.start_time(server.pid),
            port=server.port,
            host=server.host,
            variant=server.variant.name,
            engine=server.engine.name,
            log_path=str(server.log_path),
            owner_pid=os.getpid(),
            owner_start=guard.start_time(os.getpid()),
            watchdog_pid=server.watchdog.pid if server.watchdog else None,
            token=token,
        )
    )


@contextlib.contextmanager
def launch(
    variant: Variant,
    timeout_s: float = 1800.0,
    progress: bool = True,
    timeout_option: str = "--ready-timeout",
) -> Iterator[Server]:
    """Context manager: a ready server for the ``with`` body, torn down afterwards."""
    server = start(variant, timeout_s=timeout_s, progress=progress, timeout_option=timeout_option)
    try:
        yield server
    finally:
        server.stop()
