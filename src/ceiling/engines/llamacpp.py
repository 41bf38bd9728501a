"""llama.cpp adapter, through llama-cpp-python's OpenAI server (``python -m llama_cpp.server``).

The model is a GGUF file; the served name is ``--model_alias``. Flags come from the server's own
pydantic settings (``add_args_from_model``), dumped by ``data/dump_args.py llamacpp``. The server
has no ``/health`` route, so readiness is ``/v1/models`` plus uvicorn's start-up line. Streaming
differences (no ``ignore_eos``, no usage chunk) are the bench client's business, not this file's.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import TYPE_CHECKING

from ceiling.engines.base import Engine, EngineInstall, FlagTable, LaunchPlan
from ceiling.engines.vllm import DUMP_SCRIPT, _has, _quiet_env
from ceiling.errors import CeilingError

if TYPE_CHECKING:
    from ceiling.engines.variant import Variant

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
    ready_line = "Application startup complete."
    health_paths = ("/v1/models",)
    default_port = 8080
    env_prefixes = ()
    dist_names = ("llama_cpp_python",)

    def install_hint(self) -> str:
        return (
            "install it into .engines/llamacpp (`pip install 'llama-cpp-python[server]'`, which "
            "compiles llama.cpp), or point `python:` in the variant at its environment"
        )

    def launch_command(self, variant: Variant, install: EngineInstall, port: int) -> LaunchPlan:
        base = (
            list(install.command)
            if install.command
            else [
                str(install.python),
                "-m",
                "llama_cpp.server",
            ]
        )
        argv = [*base, "--model", variant.model]
        user = variant.argv()
        if variant.served_model_name and not _has(user, "--model_alias"):
            argv += ["--model_alias", variant.served_model_name]
        if not _has(user, "--host"):
            argv += ["--host", variant.host]
        if not _has(user, "--port"):
            argv += ["--port", str(port)]
        return LaunchPlan(argv=[*argv, *user], env={}, notes=list(install.notes))

    def dump_flags(self, install: EngineInstall) -> FlagTable:
        if install.python is None:
            raise CeilingError(
                "cannot ask llama-cpp-python for its flags without its Python",
                fix="set `python:` in the variant to the environment that has it",
            )
        proc = subprocess.run(
            [str(install.python), str(DUMP_SCRIPT), "llamacpp"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env=_quiet_env(),
        )
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise CeilingError(
                f"could not read llama-cpp-python's flags from {install.python}: {tail}",
                fix="check that `import llama_cpp.server` works in that environment",
            )
        data = json.loads(proc.stdout)
        data["version"] = install.version or data.get("version", "unknown")
        return FlagTable.model_validate(data)

    def phase_of(self, line: str) -> str | None:
        for pattern, phase in _PHASES:
            if pattern.search(line):
                return phase
        return None
