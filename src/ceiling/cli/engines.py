"""CLI commands of the engines group (thin: parse options, call the library, render).

Library modules are imported inside the command functions: ``ceiling --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ceiling.cli._vocab import ServerEngine, renamed
from ceiling.errors import ExitStatus


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
    app.command("preflight")(preflight_cmd)
    app.command("launch")(launch_cmd)
    app.command("inspect")(inspect_cmd)
    app.command("shm")(shm_cmd)
    app.command("stop")(stop_cmd)


def preflight_cmd(
    variants: list[Path] = typer.Argument(
        ..., help="Variant files (YAML/TOML) to check.", metavar="VARIANT"
    ),
    refresh: bool = typer.Option(False, "--refresh", help="Re-read the engine's flags."),
    json_out: bool = typer.Option(False, "--json", help="Print the reports as JSON."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress line."),
) -> None:
    """Check variants' flags, values and env against the INSTALLED engine (no model load).

    \b
    Example:
      ceiling preflight examples/variants/cpu-tiny.yaml
    """
    from ceiling.console import Progress
    from ceiling.flows import preflight
    from ceiling.render import engines as show

    with Progress("preflight", enabled=not (json_out or quiet)) as shown:
        run = preflight.run_files(
            variants,
            refresh=refresh,
            on_variant=lambda v: shown.update(f"{v.name}: asking {v.engine} for its flags"),
        )
    show.preflight(run, json_out)
    raise typer.Exit(ExitStatus.OK if run.ok else ExitStatus.FAILED)


def launch_cmd(
    variant: Path = typer.Argument(..., help="Variant file to launch."),
    ready_timeout: float = typer.Option(
        1800.0, "--ready-timeout", help="Seconds the engine may take to be ready."
    ),
    old_timeout: float = typer.Option(
        None, "--timeout", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
    ),
    port: int | None = typer.Option(
        None, "--port", help="Override the variant's port (1-65535).", metavar="PORT"
    ),
    exit_when_ready: bool = typer.Option(
        False, "--exit-when-ready", help="Stop the server once it is ready (a start-up check)."
    ),
    skip_preflight: bool = typer.Option(False, "--skip-preflight", help="Launch unchecked."),
    json_out: bool = typer.Option(False, "--json", help="Print the server info as JSON."),
    quiet: bool = typer.Option(False, "--quiet", help="No start-up progress."),
) -> None:
    """Start the engine server of a variant, wait until ready, serve until Ctrl-C.

    \b
    Example:
      ceiling launch examples/variants/cpu-tiny.yaml --port 8000

    Without a terminal, the start-up phases are printed as lines. Ctrl-C (or SIGTERM) stops the
    engine at once; an engine still starting gets SIGKILL after 5 s. If ceiling itself is
    killed, a watchdog ends the engine; `ceiling stop` ends any that outlived it anyway.
    """
    from ceiling.flows import launch
    from ceiling.render import engines as show

    timeout = renamed(ready_timeout, old_timeout, "launch --timeout", "--ready-timeout")
    launch.run(
        launch.launch_variant(variant, timeout_s=timeout, port=port),
        timeout_s=timeout,
        exit_when_ready=exit_when_ready,
        skip_preflight=skip_preflight,
        progress=not (json_out or quiet),
        on_ready=lambda server: show.launch_ready(server, json_out),
        on_serving=None if json_out else show.launch_serving,
        on_stopped=None if json_out else show.launch_stopped,
    )


def inspect_cmd(
    log: Path = typer.Argument(..., help="Engine log file (vLLM, SGLang or llama.cpp)."),
    engine: ServerEngine | None = typer.Option(
        None, "--engine", help="The engine that wrote the log (default: detect)."
    ),
    streams: int | None = typer.Option(
        None,
        "--streams",
        min=1,
        help="Streams you intend to serve at once (checked against KV capacity).",
    ),
    # `--concurrency` is a list of levels to measure elsewhere (bench, doctor): renamed here
    old_concurrency: int | None = typer.Option(
        None,
        "--concurrency",
        min=1,
        hidden=True,
        help="Old spelling, kept one release (docs/cli.md).",
    ),
    gpu: str | None = typer.Option(
        None, "--gpu", help="Catalog GPU the engine ran on (findings check advice against it)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print EngineFacts as JSON."),
) -> None:
    """Parse an engine start-up log into facts and findings.

    \b
    Example:
      ceiling inspect logs/cpu-tiny-20260101T000000-8000.log --streams 16
    """
    from ceiling.diagnose.logs import inspect_with_gpu
    from ceiling.render import engines as show

    concurrency = renamed(streams, old_concurrency, "inspect --concurrency", "--streams")
    show.inspect(inspect_with_gpu(log, engine, concurrency, gpu), json_out)


def shm_cmd(
    apply: bool = typer.Option(False, "--apply", help="Delete the stale segments (default: list)."),
    # path_type=str: `--root ""` must reach the library's "empty" error, not become "."
    root: Path = typer.Option(
        "/dev/shm",
        "--root",
        file_okay=False,
        path_type=str,
        help="Directory to scan (--apply: tmpfs only).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the listing as JSON."),
) -> None:
    """List /dev/shm segments engines/NCCL leave behind; --apply removes those nobody uses.

    \b
    Example:
      ceiling shm --apply

    A segment is in use when any process holds it open or mapped (matched by device and inode,
    so a symlinked or bind-mounted root is safe); only unused ones are removed.
    """
    from ceiling.render import engines as show
    from ceiling.run.shm import shm_report

    show.shm(shm_report(root=root, apply=apply), json_out)


def stop_cmd(
    all_servers: bool = typer.Option(
        False, "--all", help="Also stop servers whose ceiling is still running."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print what was stopped as JSON."),
) -> None:
    """Stop engine servers that outlived the ceiling that launched them.

    \b
    Example:
      ceiling stop

    Every launch is recorded (pid, port, log) under $CEILING_STATE_DIR (default
    ~/.local/state/ceiling/servers); a server whose ceiling is gone gets SIGTERM, then SIGKILL.
    """
    from ceiling.render import engines as show
    from ceiling.run.guard import stop_orphans

    report = stop_orphans(all_servers=all_servers)
    show.stop(report, json_out)
    report.check()
