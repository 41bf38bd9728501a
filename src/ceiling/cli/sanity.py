"""CLI command ``ceiling sanity`` (thin: parse options, call the library, print)."""

from __future__ import annotations

from pathlib import Path

import typer

from ceiling.cli._vocab import ServerEngine, deprecated, renamed
from ceiling.errors import ExitStatus

#: broken is a failed result; suspect is reported, not failed
EXIT = {"ok": ExitStatus.OK, "suspect": ExitStatus.OK, "broken": ExitStatus.FAILED}


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
    app.command("sanity")(sanity)


def sanity(
    url: str = typer.Option(None, "--url", help="A running OpenAI-compatible server to ask."),
    variant: Path = typer.Option(
        None, "--variant", dir_okay=False, help="A variant file: launch it, ask, stop."
    ),
    served_model: str = typer.Option(
        None, "--served-model", help="Served model name (default: the first)."
    ),
    model: str = typer.Option(
        None,
        "--model",
        help="The model's directory here: its family and the CPU reference pass (default: auto).",
    ),
    old_model_path: str = typer.Option(
        None, "--model-path", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
    ),
    engine: ServerEngine | None = typer.Option(
        None, "--engine", help="Engine of a --url server (default: auto)."
    ),
    dtype: str = typer.Option(None, "--dtype", help="The dtype the server computes in."),
    no_reference: bool = typer.Option(
        False, "--no-reference", help="Skip the reference forward pass on the CPU."
    ),
    request_timeout: float = typer.Option(
        60.0, "--request-timeout", help="Seconds one request may take."
    ),
    old_timeout: float = typer.Option(
        None, "--timeout", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress lines."),
) -> None:
    """Is the server computing the model or fast garbage? Known answers, perplexity, reference
    logits, degenerate output: ok / suspect / broken in seconds.

    \b
    Examples:
      ceiling sanity --url http://127.0.0.1:8000
      ceiling sanity --variant examples/variants/cpu-tiny.yaml --json

    The same gate runs first in doctor and in every sweep trial (docs/sanity.md). Exit codes: 0 ok
    or suspect (the verdict says which), 1 broken, 2 bad option, 3 the engine did not start,
    4 server unreachable or refused.
    """
    from ceiling.flows.sanity import SanityConfig
    from ceiling.flows.sanity import run as run_sanity
    from ceiling.render import sanity as show
    from ceiling.spec.model import is_model_input

    if model is not None and served_model is None and not is_model_input(model):
        # the previous release's --model was the served name: kept one release
        deprecated("sanity --model SERVED-NAME", "--served-model (--model is the model input)")
        model, served_model = None, model
    model_path = renamed(model, old_model_path, "sanity --model-path", "--model")
    timeout = renamed(request_timeout, old_timeout, "sanity --timeout", "--request-timeout")
    report = run_sanity(
        SanityConfig(
            url=url,
            variant=str(variant) if variant else None,
            model=served_model,
            model_path=model_path,
            engine=engine,
            dtype=dtype,
            reference=not no_reference,
            timeout_s=timeout,
            progress=not (json_out or quiet),
        )
    )
    show.report(report, json_out)
    raise typer.Exit(EXIT[report.verdict])
