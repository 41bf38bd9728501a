"""Check what deploy wrote with the real tools, where they are installed: ``systemd-analyze
verify`` for the unit, ``docker compose config`` (or Debian's ``docker-compose config``) for the
Compose file. A tool that is not there is reported as skipped, never as passed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Literal

from pydantic import BaseModel


class Validation(BaseModel):
    tool: str
    file: str
    status: Literal["passed", "failed", "skipped"]
    output: str = ""


def _run(cmd: list[str], cwd: Path | None = None) -> tuple[int, str]:
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=cwd,
            env={**os.environ, "SYSTEMD_LOG_COLOR": "0"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def verify_unit(path: Path) -> Validation:
    """``systemd-analyze verify``: syntax, directives, and that every Exec path exists."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        return Validation(
            tool="systemd-analyze verify",
            file=str(path),
            status="skipped",
            output="systemd-analyze is not installed",
        )
    rc, text = _run([tool, "verify", str(path)])
    # without a running systemd, verify still checks the unit; lines about other units (the
    # host's own) are not ours
    ours = [ln for ln in text.splitlines() if path.name in ln or "Exec" in ln]
    status = "passed" if rc == 0 and not ours else "failed"
    return Validation(
        tool="systemd-analyze verify",
        file=str(path),
        status=status,
        output="\n".join(ours) or text[-2000:],
    )


def compose_tool() -> list[str] | None:
    """``docker compose`` (the v2 plugin) if it answers, else ``docker-compose``."""
    docker = shutil.which("docker")
    if docker is not None:
        rc, _ = _run([docker, "compose", "version"])
        if rc == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def verify_compose(path: Path) -> Validation:
    """``docker compose -f FILE config -q``: the file against the Compose schema."""
    tool = compose_tool()
    name = "docker compose config"
    if tool is None:
        return Validation(
            tool=name,
            file=str(path),
            status="skipped",
            output="neither `docker compose` nor `docker-compose` is installed",
        )
    rc, text = _run([*tool, "-f", str(path), "config", "-q"], cwd=path.parent)
    name = " ".join(Path(tool[0]).name if i == 0 else t for i, t in enumerate(tool)) + " config"
    return Validation(
        tool=name, file=str(path), status="passed" if rc == 0 else "failed", output=text[-2000:]
    )
