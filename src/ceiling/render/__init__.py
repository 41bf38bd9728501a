"""The render layer: every result ceiling prints for a person is printed here.

Library functions return typed results (pydantic models); a command (``ceiling.cli``) calls
one, then hands the result to its renderer here: ``--json`` prints the model as one JSON
document on stdout, otherwise Rich lines and tables on stdout (colour only on a terminal;
piped, the same lines in plain text). Progress and notes go to stderr (``ceiling.console``:
``Progress``, ``say``), so that stdout stays the result. One module per command group:
``engines`` (preflight, launch, shm, stop, inspect), ``bench`` (bench, compare), ``probe``,
``env``, ``deploy``, ``predict``, ``sanity``, ``trace``, ``doctor`` (doctor, sweep, report).

The API (stable; a new command group adds a module of the same shape):

- a renderer per result: ``render.<group>.<noun>(result: <Model>, json_out: bool = False) ->
  None``; with ``json_out`` it calls ``emit_json`` on the model (its JSON keys, nothing added)
  and prints nothing else on stdout; otherwise it prints through ``out()`` (and ``say`` /
  ``console()`` for what belongs on stderr);
- ``out()`` / ``console()``: the stdout / stderr Rich consoles (secrets redacted on the way);
  ``emit_json(obj)``: a model, dict or list as one JSON document on stdout;
- ``esc(value)``: any text that comes from outside (paths, messages, log lines) before it goes
  into a markup string; ``table(title, header, rows)``: a left-titled table whose cells fold;
- renderers format, they do not decide: a number or verdict a person reads comes as a field
  of the result (so ``--json`` carries it too).
"""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from ceiling.console import console, emit_json, out

__all__ = ["console", "emit_json", "esc", "out", "table"]


def esc(value: object) -> str:
    """Text shown as is (``[`` in a path or a message is not Rich markup)."""
    return escape(str(value))


def table(title: str, header: list[str], rows: list[list[str]]) -> Any:
    """A Rich table with a left-aligned title; long cells fold."""
    t = Table(title=title, title_justify="left")
    for h in header:
        t.add_column(h, overflow="fold")
    for r in rows:
        t.add_row(*r)
    return t
