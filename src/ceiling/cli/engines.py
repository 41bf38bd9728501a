"""CLI commands of the engines group (thin: parse options, call the library, print)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
    app.command("preflight")(preflight_cmd)
    app.command("launch")(launch_cmd)
    app.command("inspect")(inspect_cmd)
    app.command("shm")(shm_cmd)


def preflight_cmd(
    variants: list[Path] = typer.Argument(..., help="Variant files (YAML/TOML) to check."),
    refresh: bool = typer.Option(False, "--refresh", help="Re-read the engine's flags."),
    json_out: bool = typer.Option(False, "--json", help="Print the reports as JSON."),
) -> None:
    """Check variants' flags, values and env against the INSTALLED engine (no model load)."""
    from ceiling.engines.preflight import run_preflight

    raise typer.Exit(run_preflight(variants, refresh=refresh, json_out=json_out))


def launch_cmd(
    variant: Path = typer.Argument(..., help="Variant file to launch."),
    timeout: float = typer.Option(1800.0, "--timeout", help="Seconds to wait for readiness."),
    port: int | None = typer.Option(None, "--port", help="Override the variant's port."),
    exit_when_ready: bool = typer.Option(
        False, "--exit-when-ready", help="Stop the server once it is ready (a start-up check)."
    ),
    skip_preflight: bool = typer.Option(False, "--skip-preflight", help="Launch unchecked."),
    json_out: bool = typer.Option(False, "--json", help="Print the server info as JSON."),
) -> None:
    """Start the engine server of a variant, wait until ready, serve until Ctrl-C."""
    from ceiling.run.serve import run_launch

    raise typer.Exit(
        run_launch(
            variant,
            timeout_s=timeout,
            port=port,
            exit_when_ready=exit_when_ready,
            skip_preflight=skip_preflight,
            json_out=json_out,
        )
    )


def inspect_cmd(
    log: Path = typer.Argument(..., help="Engine log file (vLLM, SGLang or llama.cpp)."),
    engine: str | None = typer.Option(
        None, "--engine", help="vllm | sglang | llamacpp (default: detect)."
    ),
    concurrency: int | None = typer.Option(
        None, "--concurrency", help="Streams you intend to serve (checked against KV capacity)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print EngineFacts as JSON."),
) -> None:
    """Parse an engine start-up log into facts and findings."""
    from ceiling.diagnose.logs import run_inspect

    raise typer.Exit(run_inspect(log, engine=engine, concurrency=concurrency, json_out=json_out))


def shm_cmd(
    apply: bool = typer.Option(False, "--apply", help="Delete the stale segments (default: list)."),
    root: Path = typer.Option(Path("/dev/shm"), "--root", help="Directory to scan."),
    json_out: bool = typer.Option(False, "--json", help="Print the listing as JSON."),
) -> None:
    """List /dev/shm segments engines/NCCL leave behind; --apply removes those nobody uses."""
    from ceiling.run.shm import run_shm

    raise typer.Exit(run_shm(root=root, apply=apply, json_out=json_out))
