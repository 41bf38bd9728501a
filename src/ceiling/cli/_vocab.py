"""The CLI's vocabulary helpers (docs/cli.md is the table): old spellings kept one release, and
the choices read from the adapters and the data they come from.

An option renamed this release keeps its old spelling as a hidden option; :func:`renamed`
takes whichever was given and says on stderr that the old one goes away.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Literal, TypeVar

T = TypeVar("T")

if TYPE_CHECKING:
    ServerEngine = str
    WeightFormatName = str
else:  # the engines ceiling can launch and read: from the adapters' registry (cheap: lazy)
    from ceiling.engines import engine_names

    ServerEngine = Literal[tuple(engine_names())]
    # the formats a user can name: spec.quant's table is the one list (stdlib-only import),
    # then llama.cpp's file types (--engine llamacpp; predict refuses each for the other engines)
    from ceiling.spec.quant import GGUF_MIXES, NAMED_FORMATS

    WeightFormatName = Literal[(*NAMED_FORMATS, *GGUF_MIXES)]


def deprecated(old: str, new: str) -> None:
    """Say once on stderr that ``old`` is the previous spelling of ``new``."""
    print(
        f"warning: {old} is deprecated and goes away in the next release: use {new}",
        file=sys.stderr,
    )


def renamed(new_value: T, old_value: T | None, old: str, new: str) -> T:
    """The value of an option renamed this release: the old spelling's when it was given (with
    a deprecation line on stderr), else the new one's."""
    if old_value is None:
        return new_value
    deprecated(old, new)
    return old_value
