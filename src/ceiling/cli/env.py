"""CLI command ``env`` (thin: parse options, call the library, render)."""

from __future__ import annotations

from pathlib import Path

import typer

from ceiling.cli._vocab import ServerEngine
from ceiling.errors import ExitStatus


def env_cmd(
    # path_type=str: a bare name (`python3`) is looked up on PATH like any command
    python: Path = typer.Option(
        None,
        "--python",
        dir_okay=False,
        path_type=str,
        help="Interpreter of the environment to check (default: this one).",
    ),
    engine: ServerEngine | None = typer.Option(
        None, "--engine", help="Check this engine's environment (as launch finds it)."
    ),
    tp: int = typer.Option(1, "--tp", help="Planned tensor-parallel size (sizes /dev/shm)."),
    shm_root: Path = typer.Option(
        Path("/dev/shm"), "--shm-root", file_okay=False, help="Shared-memory mount."
    ),
    refresh: bool = typer.Option(False, "--refresh", help="Load every binary again (no cache)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress line."),
) -> None:
    """Check an environment: requirements, binaries vs torch, driver/CUDA/arch, NCCL, shm, limits.

    \b
    Example:
      ceiling env --python .engines/vllm/bin/python --tp 8

    Every problem comes with its evidence and the exact fix; exit code 1 when one is an error.
    """
    from ceiling.envcheck.check import env_report
    from ceiling.render.env import env

    report = env_report(
        str(python) if python else None,
        tp,
        shm_root,
        refresh,
        engine=engine,
        progress=not (json_out or quiet),
    )
    env(report, json_out)
    raise typer.Exit(ExitStatus.OK if report.ok else ExitStatus.FAILED)


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
    app.command("env")(env_cmd)
