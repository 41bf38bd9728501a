"""CLI commands ``deploy`` and ``ready`` (thin: parse options, call the library, render)."""

from __future__ import annotations

from pathlib import Path

import typer

from ceiling.errors import ExitStatus


def deploy_cmd(
    variant: Path = typer.Argument(..., help="Variant file to deploy (e.g. a sweep's winner)."),
    out: Path = typer.Option(None, "--out", help="Directory (default ceiling-out/deploy/NAME)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the unit and compose file only."),
    image: str = typer.Option(None, "--image", help="Container image (default: the engine's)."),
    gpus: int = typer.Option(None, "--gpus", help="GPUs to reserve (default: from the variant: TP, 0 for a CPU variant)."),
    ready_timeout: int = typer.Option(1800, "--ready-timeout", help="Seconds to become ready."),
    env_file: Path = typer.Option(None, "--env-file", help="Secrets file (default: in --out)."),
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
        out,
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
    timeout: float = typer.Option(1800.0, "--timeout", help="Seconds to wait."),
    pid: int = typer.Option(None, "--pid", help="Give up when this process (the server) exits."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Wait until a server's health endpoints answer 200 (a unit's readiness check).

    \b
    Example:
      ceiling ready --url http://127.0.0.1:8000 --path /health --timeout 600
    """
    from ceiling.deploy.ready import ready
    from ceiling.render import deploy as show

    show.ready(ready(url, path or [], timeout, pid), json_out)


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
    app.command("deploy")(deploy_cmd)
    app.command("ready")(ready_cmd)
