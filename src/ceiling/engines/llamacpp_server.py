"""llama.cpp's default flavour, engine ``llamacpp``: the real ``llama-server`` binary.

Built by scripts/install-llamacpp.sh from the llama.cpp source llama-cpp-python vendors (one
compile for both flavours) and found as ``.engines/llamacpp/bin/llama-server``, the variant's
``command:``, ``$CEILING_LLAMACPP_SERVER`` or ``llama-server`` on PATH. Measured with the build of
llama-cpp-python 0.3.36's llama.cpp serving the tiny GGUF; see docs/engines.md.

- Command: ``llama-server --model FILE.gguf --alias NAME --host H --port P`` plus the
  variant's flags (``--ctx-size 512``).
- Flags: llama.cpp's own C++ parser (common/arg.cpp) has no Python to import: the table is read
  from ``llama-server --help`` (``parse_server_help``): each option line lists its spellings
  (``-c,    --ctx-size N``), a value hint, and its help, which ends with ``(env: LLAMA_ARG_...)``
  when an environment variable sets it too. Spellings are exact: ``--ctx_size`` is an error.
- Readiness: ``/health`` answers 503 while the model loads, then 200; plus ``/v1/models``.
- Start-up log: the same llama.cpp loader lines as the Python flavour (``llama_model_loader:``,
  ``print_info:``, ``load_tensors:``, ``llama_context:``, ...; parsed by llamacpp.py), then the
  server's own: ``srv  load_model: ...``, ``main: model loaded``, ``... listening on http://...``;
  ``n_slots`` (parallel sequences) is its concurrency.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ceiling.engines.base import EngineInstall, quiet_env, search_roots
from ceiling.engines.facts import EngineFacts
from ceiling.engines.flags import FlagSpec, FlagTable
from ceiling.engines.llamacpp import (
    _PHASES,
    LlamaCppEngine,
)
from ceiling.engines.variant import Variant
from ceiling.errors import CeilingError
from ceiling.gap_schema import BandwidthGap

_OPTION_LINE = re.compile(r"^(-{1,2}[A-Za-z0-9][^\s,]*)")
_ENV = re.compile(r"\(env: ([A-Z0-9_]+)\)")
# ``version: 0.5.0-dev (build 1, commit 0c1e570)``; older builds: ``version: 4589 (4f0c5d1)``
_VERSION = re.compile(r"version: (?:(\S+) \(build (\d+), commit (\w+)\)|(\d+) \((\w+)\))")
_SERVER_PHASES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"llama_server: listening on "), "ready"),
    (
        re.compile(r"llama_server: model loaded|load_model: initializing, n_slots"),
        "starting the HTTP server",
    ),
    (re.compile(r"load_model: loading model"), "reading the GGUF file"),
]


def parse_server_help(text: str) -> tuple[list[FlagSpec], list[str]]:
    """Flags and environment variables from ``llama-server --help`` (llama.cpp's
    ``common_arg::to_string``: spellings and value hint in the first 40 columns, help after)."""
    specs: list[FlagSpec] = []
    envs: list[str] = []
    current: dict[str, object] | None = None
    for line in text.splitlines():
        if _OPTION_LINE.match(line):
            # spellings + hint fill the first 40 columns, help follows; a longer head takes
            # the whole line and its help starts on the next one
            short = len(line) > 40 and line[38:40] == "  "
            head, help_text = (line[:40], line[40:]) if short else (line, "")
            if current:
                specs.append(_spec(current))
            current = {"head": head.rstrip(), "help": help_text.strip()}
        elif current is not None and line.startswith(" " * 40):
            current["help"] = f"{current['help']} {line.strip()}"
        elif current is not None and not line.strip():
            specs.append(_spec(current))
            current = None
    if current:
        specs.append(_spec(current))
    for s in specs:
        m = _ENV.search(s.help)
        if m:
            envs.append(m.group(1))
    return specs, envs


def _spec(entry: dict[str, object]) -> FlagSpec:
    head = str(entry["head"])
    help_text = str(entry["help"])
    options: list[str] = []
    rest = head
    while True:
        m = re.match(r"\s*(-{1,2}[A-Za-z0-9][\w.-]*)\s*(,\s*)?", rest)
        if not m:
            break
        options.append(m.group(1))
        rest = rest[m.end() :]
        if not m.group(2):
            break
    hint = rest.strip()
    cm = (
        re.fullmatch(r"[\[{<]([\w.-]+(?:[|,][\w.-]+)+)[\]}>]", hint.split(" ")[0]) if hint else None
    )
    choices = re.split(r"[|,]", cm.group(1)) if cm else None
    negated = any(o.startswith("--no-") for o in options)
    if "--help" in options:
        kind, nargs = "help", 0
    elif not hint:
        kind, nargs = ("bool_optional" if negated else "flag"), 0
    else:
        kind, nargs = "value", None
    return FlagSpec(
        options=options,
        dest=(next((o for o in options if o.startswith("--")), options[0]))
        .lstrip("-")
        .replace("-", "_"),
        kind=kind,
        nargs=nargs,
        choices=choices,
        type="int" if hint in ("N", "N N") and kind == "value" else None,
        deprecated="deprecated" in help_text.lower(),
        help=help_text,
    )


class LlamaServerEngine(LlamaCppEngine):
    """llama.cpp's ``llama-server``."""

    name = "llamacpp"
    display_name = "llama-server"
    ready_line = "llama_server: listening on "

    def step_gap(
        self,
        facts: EngineFacts,
        hardware: Any,
        step_ms: float,
        context: int,
        evidence: Mapping[str, str | None],
    ) -> BandwidthGap | None:
        """The bandwidth llama-server reaches at one stream on a GPU (``llamacpp_gap``)."""
        from ceiling.engines.llamacpp_gap import run_gap

        return run_gap(
            facts, hardware, step_ms, context, evidence.get("llama_bench"), evidence.get("profile")
        )

    kernels_import = ""  # a binary, not a Python environment: ``ceiling env`` has nothing to load
    health_paths = ("/health", "/v1/models")
    default_port = 8080
    env_prefixes = ("LLAMA_ARG_",)
    # explicit CPU only (llama-server's own default depends on its build)
    cpu_flags: ClassVar[dict[str, tuple[str, ...]]] = {
        "--n-gpu-layers": ("0",),
        "-ngl": ("0",),
        "--gpu-layers": ("0",),
        "--device": ("none",),
    }
    # `--help`: --api-key KEY ... (env: LLAMA_API_KEY)
    api_key_env: tuple[str, ...] = ("LLAMA_API_KEY",)
    dist_names = ()
    server_module = ""
    model_flag = "--model"
    served_name_flag = "--alias"
    flags_module = "llama-server --help"
    # llama.cpp's parser reads `_` as `-` (`--ctx_size` is --ctx-size; its own error message
    # for an unknown `--no_such_flag` says `--no-such-flag`)
    dash_underscore_alias = True
    container_image = "ghcr.io/ggml-org/llama.cpp:server"
    container_entrypoint = ("/app/llama-server",)
    container_health_tool = "curl"
    log_phases = (*_SERVER_PHASES, *_PHASES)
    # ``--metrics`` (tools/server/server-context.cpp): counters only, no histograms. n_decode is
    # every llama_decode() call (one per engine step, prompt batches included); tokens_predicted
    # and its seconds are summed over slots, so their ratio is the engine's own time per token
    metric_prefix = "llamacpp:"
    metric_counters = {  # noqa: RUF012 (class data, read only)
        "engine_steps": ("llamacpp:n_decode_total",),
        "generated_tokens": ("llamacpp:tokens_predicted_total",),
        "decode_seconds": ("llamacpp:tokens_predicted_seconds_total",),
        "prompt_tokens": ("llamacpp:prompt_tokens_total",),
    }

    # llama-server cannot return prompt log-probabilities: its /v1/completions refuses ``echo``
    # ("Only no echo is supported", tools/server/server-common.cpp) and ``n_probs`` covers the
    # generated tokens only; no server flag changes that (``--logits_all`` is llama-cpp-python's)
    prompt_logprobs_hint = (
        "llama-server returns no prompt log-probabilities (it refuses echo; n_probs covers "
        "generated tokens only): measure perplexity with `llama-perplexity -m MODEL.gguf -f "
        "TEXT.txt`, or serve the GGUF with llama-cpp-python (engine llamacpp-python)"
    )
    # ``GET /props``: ``default_generation_settings`` is slot 0's ``to_json()``, whose ``n_ctx``
    # is the context one slot serves (all of -c with --kv-unified, else -c / --parallel)
    context_path = "/props"

    def served_context_from(self, answer: Any) -> int | None:
        settings = answer.get("default_generation_settings") if isinstance(answer, dict) else None
        n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
        return (
            n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0 else None
        )

    def install_hint(self) -> str:
        return (
            "install it with `bash scripts/install-llamacpp.sh` (builds llama-server, ~4-6 min on 2 cores) "
            "into .engines/llamacpp, or set `command: [/path/to/llama-server]` in the variant"
        )

    def image_for(self, install: EngineInstall) -> str | None:
        return self.container_image

    def locate(self, variant: Variant) -> EngineInstall:
        """The variant's ``command``, ``$CEILING_LLAMACPP_SERVER``, ``.engines/llamacpp/bin/
        llama-server`` (cwd, its parents, the checkout), or ``llama-server`` on PATH."""
        candidates: list[Path] = []
        if variant.command:
            install = super(LlamaCppEngine, self).locate(variant)
            install.version = _version(install.command[0]) if install.command else None
            return install
        env = os.environ.get("CEILING_LLAMACPP_SERVER")
        if env:
            candidates.append(Path(env))
        candidates += [
            r / ".engines" / "llamacpp" / "bin" / "llama-server" for r in search_roots(variant)
        ]
        on_path = shutil.which("llama-server")
        if on_path:
            candidates.append(Path(on_path))
        for exe in candidates:
            if exe.exists() and os.access(exe, os.X_OK):
                version = _version(str(exe))
                if version is not None:
                    return EngineInstall(
                        python=None, command=[str(exe)], version=version, dist="llama-server"
                    )
        tried = ", ".join(str(c) for c in candidates[:3]) or "nothing"
        raise CeilingError(
            f"llama-server is not installed (looked for {tried})", fix=self.install_hint()
        )

    def dump_flags(self, install: EngineInstall) -> FlagTable:
        """``llama-server --help``, parsed (llama.cpp's parser is C++: nothing to import)."""
        assert install.command is not None
        proc = subprocess.run(
            [*install.command, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=quiet_env(install.env),
        )
        actions, env = parse_server_help(proc.stdout + proc.stderr)
        if proc.returncode != 0 or len(actions) < 20:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise CeilingError(
                f"could not read llama-server's flags from `{install.command[0]} --help`: {tail}",
                fix="check that the binary runs (`llama-server --version`)",
            )
        return FlagTable(
            engine=self.name,
            version=install.version or "unknown",
            source="help",
            actions=actions,
            env=env,
        )


def _version(exe: str) -> str | None:
    """``b<build>.<commit>`` from ``llama-server --version``; None when it does not run."""
    try:
        proc = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:
        return None
    m = _VERSION.search(proc.stdout + proc.stderr)
    if not m:
        return None
    return f"b{m.group(2)}.{m.group(3)}" if m.group(1) else f"b{m.group(4)}.{m.group(5)}"
