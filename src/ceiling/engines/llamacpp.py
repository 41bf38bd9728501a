"""llama.cpp adapter, through llama-cpp-python's OpenAI server (``python -m llama_cpp.server``).

The model is a GGUF file; the served name is ``--model_alias``. Flags come from the server's own
pydantic settings (``add_args_from_model``), dumped by ``data/dump_args.py llamacpp``. The server
has no ``/health`` route, so readiness is ``/v1/models`` plus uvicorn's start-up line. Streaming
differences (no ``ignore_eos``, no usage chunk) are the bench client's business, not this file's.
It has no start-up log grammar (``ceiling inspect``) and no Prometheus ``/metrics``.
"""

from __future__ import annotations

import re

from ceiling.engines.base import Engine

_PHASES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"Application startup complete"), "ready"),
    (re.compile(r"Uvicorn running on|Started server process"), "starting API server"),
    (
        re.compile(r"llama_kv_cache|llama_new_context_with_model|llama_context:"),
        "allocating KV cache",
    ),
    (re.compile(r"load_tensors:|llm_load_tensors:"), "loading weights"),
    (re.compile(r"llama_model_loader:"), "reading the GGUF file"),
]


class LlamaCppEngine(Engine):
    """llama-cpp-python's server (``llama_cpp.server``)."""

    name = "llamacpp"
    display_name = "llama-cpp-python"
    ready_line = "Application startup complete."
    health_paths = ("/v1/models",)
    default_port = 8080
    env_prefixes = ()
    dist_names = ("llama_cpp_python",)
    server_module = "llama_cpp.server"
    model_flag = "--model"
    served_name_flag = "--model_alias"
    flags_module = "llama_cpp.server"
    log_phases = _PHASES

    def install_hint(self) -> str:
        return (
            "install it into .engines/llamacpp (`pip install 'llama-cpp-python[server]'`, which "
            "compiles llama.cpp), or point `python:` in the variant at its environment"
        )
