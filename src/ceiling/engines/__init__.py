"""All engine-specific knowledge: one adapter module per engine, looked up by name.

A new engine is one new module with an :class:`~ceiling.engines.base.Engine` subclass, listed in
``_ADAPTERS`` (base.py says what a subclass provides). The registration order is the order in
which ``bench.server_metrics`` tries the engines' metric names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ceiling.errors import CeilingError

if TYPE_CHECKING:
    from ceiling.engines.base import Engine

_ADAPTERS = {
    "vllm": ("ceiling.engines.vllm", "VllmEngine"),
    "sglang": ("ceiling.engines.sglang", "SglangEngine"),
    # llama.cpp: the real llama-server binary (default), llama-cpp-python's server (second)
    "llamacpp": ("ceiling.engines.llamacpp_server", "LlamaServerEngine"),
    "llamacpp-python": ("ceiling.engines.llamacpp", "LlamaCppEngine"),
}
_ALIASES = {
    "llama.cpp": "llamacpp",
    "llama-cpp": "llamacpp",
    "llama_cpp": "llamacpp",
    "llama-server": "llamacpp",
    "llama-cpp-python": "llamacpp-python",
    "llama_cpp_python": "llamacpp-python",
}


def engine_names() -> list[str]:
    """Names accepted by :func:`get_engine` (without aliases)."""
    return sorted(_ADAPTERS)


def get_engine(name: str) -> Engine:
    """The adapter for ``name`` (``vllm``, ``sglang``, ``llamacpp``, ``llamacpp-python``);
    CeilingError if unknown."""
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in _ADAPTERS:
        raise CeilingError(
            f"unknown engine {name!r}",
            fix=f"use one of: {', '.join(engine_names())}",
        )
    module, cls = _ADAPTERS[key]
    return getattr(importlib.import_module(module), cls)()


def all_engines() -> list[Engine]:
    """Every adapter, in registration order."""
    return [get_engine(name) for name in _ADAPTERS]
