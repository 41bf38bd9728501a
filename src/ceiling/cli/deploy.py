"""CLI commands ``deploy`` and ``ready`` (thin: parse options, call the library, render)."""

from __future__ import annotations

from pathlib import Path

import typer

from ceiling.cli._vocab import renamed
from ceiling.errors import ExitStatus


def deploy_cmd(
    variant: Path = typer.Argument(..., help="Variant file to deploy (e.g. a sweep's winner)."),
    out_dir: Path = typer.Option(
        None, "--out-dir", file_okay=False, help="Directory (default ceiling-out/deploy/NAME)."
    ),
    old_out: Path = typer.Option(
        None, "--out", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the unit and compose file only."),
    image: str = typer.Option(None, "--image", help="Container image (default: the engine's)."),
    gpus: int = typer.Option(
        None, "--gpus", help="GPUs to reserve (default: from the variant: TP, 0 for a CPU variant)."
    ),
    ready_timeout: int = typer.Option(1800, "--ready-timeout", help="Seconds to become ready."),
    env_file: Path = typer.Option(
        None, "--env-file", dir_okay=False, help="Secrets file (default: in --out)."
    ),
    no_validate: bool = typer.Option(False, "--no-validate", help="Skip the validators."),
    json_out: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """Write a variant as a systemd unit and a Docker Compose service, validated.

    \b
    Example:
      ceiling deploy ceiling-out/sweep/winner.yaml --dry-run

    Secrets are referenced (EnvironmentFile= / env_file:), never written.
    """
    from ceiling.flows import deploy
    from ceiling.render import deploy as show

    result = deploy.run(
        variant,
        renamed(out_dir, old_out, "deploy --out", "--out-dir"),
        dry_run=dry_run,
        image=image,
        gpus=gpus,
        ready_timeout_s=ready_timeout,
        env_file=env_file,
        validate=not no_validate,
    )
    show.deploy(result, json_out)
    raise typer.Exit(ExitStatus.OK if result.ok else ExitStatus.FAILED)


def ready_cmd(
    url: str = typer.Option(..., "--url", help="The server, e.g. http://127.0.0.1:8000."),
    path: list[str] = typer.Option(None, "--path", help="Health path(s) (default /health)."),
    ready_timeout: float = typer.Option(
        1800.0, "--ready-timeout", help="Seconds the server may take to be ready."
    ),
    old_timeout: float = typer.Option(
        None, "--timeout", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
    ),
    pid: int = typer.Option(None, "--pid", help="Give up when this process (the server) exits."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Wait until a server's health endpoints answer 200 (a unit's readiness check).

    \b
    Example:
      ceiling ready --url http://127.0.0.1:8000 --path /health --ready-timeout 600
    """
    from ceiling.deploy.ready import ready
    from ceiling.render import deploy as show

    timeout = renamed(ready_timeout, old_timeout, "ready --timeout", "--ready-timeout")
    show.ready(ready(url, path or [], timeout, pid), json_out)


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
    app.command("deploy")(deploy_cmd)
    app.command("ready")(ready_cmd)
