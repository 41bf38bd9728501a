"""``ceiling launch``: preflight, start, wait for readiness, serve until interrupted."""

from __future__ import annotations

import time
from pathlib import Path

from ceiling.errors import CeilingError
from ceiling.run.launcher import EngineDied, start
from ceiling.run.ports import check_port


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

    check_port(port)
    if timeout_s <= 0:
        raise CeilingError(f"--timeout {timeout_s:g} is not positive", fix="e.g. --timeout 600")
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
        if server.key_note():
            console().print(f"note: {server.key_note()}")
    try:
        if not exit_when_ready:
            if not json_out:
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
