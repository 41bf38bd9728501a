"""SGLang adapter: ``python -m sglang.launch_server``, flags from ``ServerArgs``, log phases.

SGLang's flags come from ``ServerArgs.add_cli_args`` imported in the engine's Python (see
``data/dump_args.py``); its log lines look like ``[2026-05-12 11:00:05 TP0] Load weight begin.``
and readiness is "The server is fired up and ready to roll!" plus ``/health``.
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
    (re.compile(r"The server is fired up and ready to roll"), "ready"),
    (re.compile(r"max_total_num_tokens="), "starting API server"),
    (re.compile(r"Capture cuda graph|Capturing batches"), "capturing CUDA graphs"),
    (re.compile(r"KV Cache is allocated|Memory pool end"), "allocating KV cache"),
    (re.compile(r"Load weight end"), "weights loaded"),
    (re.compile(r"Load weight begin|Loading safetensors checkpoint shards"), "loading weights"),
    (re.compile(r"Init torch distributed"), "initialising distributed"),
    (re.compile(r"server_args=ServerArgs"), "parsing arguments"),
]
_SHARDS = re.compile(r"Loading safetensors checkpoint shards:\s+(\d+)% Completed \| (\d+)/(\d+)")


class SglangEngine(Engine):
    """SGLang's HTTP server (``sglang.launch_server``)."""

    name = "sglang"
    ready_line = "The server is fired up and ready to roll!"
    health_paths = ("/health", "/v1/models")
    default_port = 30000
    env_prefixes = ("SGLANG_",)
    dist_names = ("sglang",)

    def install_hint(self) -> str:
        return (
            "install SGLang into .engines/sglang (`pip install 'sglang[all]'`), or point "
            "`python:` in the variant at the environment that has it"
        )

    def launch_command(self, variant: Variant, install: EngineInstall, port: int) -> LaunchPlan:
        base = (
            list(install.command)
            if install.command
            else [
                str(install.python),
                "-m",
                "sglang.launch_server",
            ]
        )
        argv = [*base, "--model-path", variant.model]
        user = variant.argv()
        if variant.served_model_name and not _has(user, "--served-model-name"):
            argv += ["--served-model-name", variant.served_model_name]
        if not _has(user, "--host"):
            argv += ["--host", variant.host]
        if not _has(user, "--port"):
            argv += ["--port", str(port)]
        return LaunchPlan(argv=[*argv, *user], env={}, notes=list(install.notes))

    def dump_flags(self, install: EngineInstall) -> FlagTable:
        if install.python is None:
            raise CeilingError(
                "cannot ask SGLang for its flags without its Python",
                fix="set `python:` in the variant to the environment that has SGLang",
            )
        proc = subprocess.run(
            [str(install.python), str(DUMP_SCRIPT), "sglang"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env=_quiet_env(),
        )
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise CeilingError(
                f"could not read SGLang's flags from {install.python}: {tail}",
                fix="check that `import sglang.srt.server_args` works in that environment",
            )
        data = json.loads(proc.stdout)
        data["version"] = install.version or data.get("version", "unknown")
        return FlagTable.model_validate(data)

    def phase_of(self, line: str) -> str | None:
        m = _SHARDS.search(line)
        if m:
            return f"loading weights {m.group(2)}/{m.group(3)} shards"
        for pattern, phase in _PHASES:
            if pattern.search(line):
                return phase
        return None
