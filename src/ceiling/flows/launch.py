"""``ceiling launch``: preflight, start, wait for readiness, serve until interrupted."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ceiling.console import Progress
from ceiling.engines.variant import Variant, load_variant
from ceiling.errors import CeilingError
from ceiling.flows import preflight
from ceiling.run.launcher import EngineDied, Server, StopResult, start
from ceiling.run.ports import check_port


def launch_variant(path: Path, timeout_s: float, port: int | None = None) -> Variant:
    """The variant file of ``ceiling launch``, with ``--port`` applied (options checked)."""
    check_port(port)
    if timeout_s <= 0:
        raise CeilingError(
            f"--ready-timeout {timeout_s:g} is not positive", fix="e.g. --ready-timeout 600"
        )
    variant = load_variant(path)
    return variant if port is None else variant.with_overrides(port=port)


def run(
    variant: Variant,
    timeout_s: float = 1800.0,
    exit_when_ready: bool = False,
    skip_preflight: bool = False,
    progress: bool = True,
    on_ready: Callable[[Server], None] | None = None,
    on_serving: Callable[[Server], None] | None = None,
    on_stopped: Callable[[Server, StopResult], None] | None = None,
) -> None:
    """Preflight ``variant``, start it, wait until ready, serve until Ctrl-C (or at once with
    ``exit_when_ready``), stop it. The ``on_*`` callbacks hear the server at each step."""
    if not skip_preflight:
        with Progress(f"{variant.name}: preflight", enabled=progress):
            report = preflight.run(variant)
        if not report.ok:
            first = report.errors[0]
            raise CeilingError(
                f"{variant.name}: preflight failed: {first.message}"
                + (f" (+{len(report.errors) - 1} more)" if len(report.errors) > 1 else ""),
                fix=first.fix or "run `ceiling preflight` for the full list",
            )
    server = start(
        variant, timeout_s=timeout_s, progress=progress, timeout_option="--ready-timeout"
    )
    if on_ready is not None:
        on_ready(server)
    try:
        if not exit_when_ready:
            if on_serving is not None:
                on_serving(server)
            while server.alive():
                time.sleep(1.0)
            raise EngineDied(server.death(), server.log_path, variant.name)
    except KeyboardInterrupt:
        pass
    finally:
        result = server.stop()
        if on_stopped is not None:
            on_stopped(server, result)
