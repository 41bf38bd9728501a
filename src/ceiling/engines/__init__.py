"""All engine-specific knowledge: one adapter module per engine, looked up by name.

A new engine is one new module with an :class:`~ceiling.engines.base.Engine` subclass, listed in
``names.ADAPTERS`` (base.py says what a subclass provides); what the diagnosis reads of it (its
log grammar, its findings' fixes) is data in ``diagnosis_data.py``. The registration order is the
order in which ``bench.server_metrics`` tries the engines' metric names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ceiling.engines.names import ADAPTERS, canonical_name, engine_names

if TYPE_CHECKING:
    from ceiling.engines.base import Engine

__all__ = ["all_engines", "engine_names", "get_engine"]


def get_engine(name: str) -> Engine:
    """The adapter for ``name`` (``vllm``, ``sglang``, ``llamacpp``, ``llamacpp-python``);
    CeilingError if unknown."""
    module, cls = ADAPTERS[canonical_name(name)]
    return getattr(importlib.import_module(module), cls)()


def all_engines() -> list[Engine]:
    """Every adapter, in registration order."""
    return [get_engine(name) for name in ADAPTERS]
