"""The engines' names: which adapters exist (module and class, by name) and the aliases users
type. Data only, so that the diagnosis can resolve a name without importing an adapter."""

from __future__ import annotations

from ceiling.errors import CeilingError

#: name -> (module, class) of its adapter; the order is the registration order (in which
#: ``bench.server_metrics`` tries the engines' metric names)
ADAPTERS = {
    "vllm": ("ceiling.engines.vllm", "VllmEngine"),
    "sglang": ("ceiling.engines.sglang", "SglangEngine"),
    # llama.cpp: the real llama-server binary (default), llama-cpp-python's server (second)
    "llamacpp": ("ceiling.engines.llamacpp_server", "LlamaServerEngine"),
    "llamacpp-python": ("ceiling.engines.llamacpp", "LlamaCppEngine"),
}
ALIASES = {
    "llama.cpp": "llamacpp",
    "llama-cpp": "llamacpp",
    "llama_cpp": "llamacpp",
    "llama-server": "llamacpp",
    "llama-cpp-python": "llamacpp-python",
    "llama_cpp_python": "llamacpp-python",
}


def engine_names() -> list[str]:
    """Names accepted by ``get_engine`` (without aliases)."""
    return sorted(ADAPTERS)


def canonical_name(name: str) -> str:
    """The engine's own name for ``name`` (an alias or any case); CeilingError if unknown."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in ADAPTERS:
        raise CeilingError(
            f"unknown engine {name!r}",
            fix=f"use one of: {', '.join(engine_names())}",
        )
    return key
