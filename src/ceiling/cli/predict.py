"""CLI commands of the predict group (thin: parse options, call the library, print)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
