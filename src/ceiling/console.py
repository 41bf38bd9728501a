"""Terminal output shared by all commands: a Rich console on stderr for humans, JSON on stdout.

Human-readable progress and tables go to stderr so that ``--json`` output on stdout stays
machine-readable even when progress is shown. Everything written here passes through the one
secret redactor (:mod:`ceiling.redact`): the consoles write through :class:`RedactingStream`,
and :func:`dumps` (every JSON ceiling prints or saves) redacts its text.
"""

from __future__ import annotations

import json
import sys
from functools import cache
from typing import IO, TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from rich.console import Console


class RedactingStream:
    """A text stream that masks secrets (:func:`ceiling.redact.redact`) in what is written to it,
    and otherwise behaves like the stream it wraps (``isatty``, ``fileno``, ``encoding``).
    The stream is looked up on each use (``sys.stderr`` may be replaced, as tests do)."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def _stream(self) -> Any:
        return getattr(sys, self._name)

    def write(self, text: str) -> int:
        from ceiling.redact import redact

        self._stream.write(redact(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@cache
def console() -> Console:
    """The stderr console (imported lazily: Rich costs start-up time)."""
    from rich.console import Console

    return Console(file=cast("IO[str]", RedactingStream("stderr")), highlight=False)


@cache
def out() -> Console:
    """A console on stdout for the human-readable result of a command."""
    from rich.console import Console

    return Console(file=cast("IO[str]", RedactingStream("stdout")), highlight=False)


def _default(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(obj)
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    if hasattr(obj, "__fspath__"):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def dumps(obj: Any, indent: int | None = 2) -> str:
    """JSON text for pydantic models, dataclasses and plain data, with secrets masked."""
    from ceiling.redact import redact

    return redact(json.dumps(obj, default=_default, indent=indent, allow_nan=False))


def emit_json(obj: Any) -> None:
    """Print one JSON document on stdout (the ``--json`` contract of every command)."""
    sys.stdout.write(dumps(obj) + "\n")
    sys.stdout.flush()
