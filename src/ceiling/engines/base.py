"""What every engine adapter provides, and the shared machinery (finding the engine, caching).

An adapter (one file per engine: vllm.py, sglang.py, llamacpp.py) knows these things about its
engine, and none of them lives outside ``ceiling.engines``:
- how to find it and build its server command line (``locate``, ``launch_command``: by default
  ``python -m <server_module> <model_flag> MODEL``);
- which flags and environment variables it accepts (``flag_table``, asked of the installed engine
  through ``data/dump_args.py`` and cached per version) and which flags it removed or renamed (a
  data file);
- how its log reads while starting (``log_phases``/``phase_of``, ``ready_line``); why it died is
  read with ``data/death_causes.yaml`` (rules may be limited to some engines);
- the grammar of its start-up log for ``ceiling inspect``, as data (``log_grammar``: its line
  shape and rules, read by the one driver in ``logparse.py`` into
  :class:`~ceiling.engines.facts.EngineFacts`; ``claims_log`` says whose log it is), with the
  fixes of its findings and how it streams: ``diagnosis_data.py``, no I/O, which
  ``ceiling.diagnose`` reads without importing the adapter;
- its parser's quirks for ``preflight`` (``canonical_flag``, ``flag_problems``: vLLM's ``-O``;
  ``value_types``: the value readers of its parser beyond int/float, e.g. word booleans);
- the names of its Prometheus latency histograms (``metric_prefix``, ``metric_histograms``);
- where its readiness endpoints are (``health_paths``);
- how ``ceiling sanity`` asks it for greedy text of an exact length and for the log-probabilities
  of a prompt (``ignore_eos_field``, ``token_ids_request``, ``prompt_logprobs_request``,
  ``read_prompt_logprobs``; shapes in ``sampling.py``);
- how it records its own kernels (``profiler``: the flags/variables a launch gets, the window's
  endpoints, where each rank's trace lands, the sentence for a server ceiling did not launch;
  nouns in ``profiling.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ceiling.engines.diagnosis_data import READINGS, EngineReading
from ceiling.engines.facts import EngineFacts, StreamingTraits
from ceiling.engines.flags import VALUE_TYPES, FlagSpec, FlagTable, Problem, ValueType, has_flag
from ceiling.engines.install import (
    EngineInstall,
    dist_versions,
    import_env,
    python_path,
    quiet_env,
    search_roots,
)
from ceiling.engines.kernels import KernelVariants
from ceiling.engines.logparse import LogGrammar
from ceiling.engines.profiling import ProfilerSetup, unsupported
from ceiling.engines.sampling import PromptLogprobs, read_openai_echo
from ceiling.engines.tables import RemovedFlag, RemovedFlagsFile, removed_flags_table
from ceiling.engines.variant import Arg, Variant
from ceiling.errors import CeilingError
from ceiling.gap_schema import BandwidthGap
from ceiling.inputs import read_text
from ceiling.outputs import cache_dir, write_cache
from ceiling.spec._data import M, load_yaml

DATA_DIR = Path(__file__).parent / "data"
DUMP_SCRIPT = DATA_DIR / "dump_args.py"


@dataclass
class LaunchPlan:
    """The server command line and what the adapter did to make it work (said to the user)."""

    argv: list[str]
    env: dict[str, str]
    notes: list[str] = field(default_factory=list)


class Engine:
    """Base class of engine adapters. Subclasses set the class attributes and override hooks."""

    name: str = ""
    display_name: str = ""  # how messages name the engine ("SGLang")
    ready_line: str = ""
    health_paths: tuple[str, ...] = ("/health", "/v1/models")
    default_port: int = 8000
    env_prefixes: tuple[str, ...] = ()
    dist_names: tuple[str, ...] = ()
    install_dir: str = ""  # the environment under .engines/ (default: ``name``)
    # the server: ``python -m <server_module> <model_flag> MODEL [<served_name_flag> NAME]``
    server_module: str = ""
    model_flag: str = ""  # empty: the model is a positional argument
    served_name_flag: str = "--served-model-name"
    flags_module: str = ""  # what dump_args.py imports for the flags (named when that fails)
    # whether the parser takes ``--max-model-len`` and ``--max_model_len`` alike (vLLM's does);
    # when False, preflight wants each flag spelled exactly as the parser defines it
    dash_underscore_alias: bool = True
    # start-up phases for the launch progress: (pattern, phase), first match wins, after
    # ``shard_progress`` (groups: percent, shards loaded, shards in all); a line is read without
    # the grammar's ``prefix``
    log_phases: ClassVar[Sequence[tuple[re.Pattern[str], str]]] = ()
    shard_progress: ClassVar[re.Pattern[str] | None] = None
    # ``preflight``: the value types of this engine's parser beyond Python's int/float, by the
    # name data/dump_args.py records (vLLM's ``human_readable_int``, word booleans ...)
    value_types: ClassVar[dict[str, ValueType]] = {}
    # Prometheus /metrics: our quantity (ttft, itl, queue, e2el, prefill, decode) -> histogram
    # names, newest first; every name starts with ``metric_prefix``
    metric_prefix: str = ""
    metric_histograms: ClassVar[dict[str, tuple[str, ...]]] = {}
    # counters whose increase over a run means something (``preemptions``...), newest first
    metric_counters: ClassVar[dict[str, tuple[str, ...]]] = {}
    # the API key the server then requires: its flag(s) (normalised names) and variable(s)
    api_key_flags: tuple[str, ...] = ("api-key",)
    api_key_env: tuple[str, ...] = ()

    def api_key(self, variant: Variant, environ: Mapping[str, str] | None = None) -> str | None:
        """The API key a server started from ``variant`` requires (None: it requires none):
        its flag in the variant, else its variable in the variant's ``env`` or in ``environ``
        (the launcher's environment, which the server inherits)."""
        for arg in variant.args:
            if arg.key in self.api_key_flags and arg.values:
                return arg.values[0]
        merged = {**(os.environ if environ is None else environ), **variant.env}
        for name in self.api_key_env:
            if merged.get(name):
                return merged[name]
        return None

    # ``ceiling env``/``deploy``: the flags that set tensor parallelism (first value wins), and
    # requirements of the engine that are absent ON PURPOSE in an environment whose torch
    # version carries ``intended_absent_when`` (e.g. "+cpu"): dist -> why
    tp_flags: tuple[str, ...] = ()
    # ``ceiling deploy``'s GPU reservation: what in a variant says it runs on the CPU (a flag
    # with one of these values, "" meaning the flag is absent; a variable with this prefix). The
    # variant decides, not the install deploy runs on (a CPU build here deploys GPU variants).
    cpu_flags: ClassVar[dict[str, tuple[str, ...]]] = {}
    cpu_env_prefixes: tuple[str, ...] = ()
    intended_absent: ClassVar[dict[str, str]] = {}
    intended_absent_when: str = ""
    # kernel extensions shipped in several instruction-set builds, of which the engine imports
    # one (``ceiling env`` loads only that one: the others may die by SIGILL on this CPU)
    kernel_variants: ClassVar[tuple[KernelVariants, ...]] = ()
    # Python that imports the engine's kernels its own way in its environment (exit 0: they load)
    kernels_import: str = ""
    # ``ceiling deploy``'s Compose service: the engine's published image ({version} filled in;
    # empty: none known, the user names one), what runs the server in it, and the tool its
    # healthcheck calls (python3 or curl)
    container_image: str = ""
    container_entrypoint: tuple[str, ...] = ()
    container_health_tool: str = "python3"
    # ``ceiling sanity``: the request field that generates past end-of-sequence (None: the
    # engine has none, or is not known, so an exact-length answer cannot be asked for), and
    # what to do when the engine does not return prompt log-probabilities
    ignore_eos_field: str | None = None
    prompt_logprobs_hint: str = ""
    # where a running server says its version (GET path -> {"version": ...}; None: nowhere):
    # the profiler's form for a server ceiling did not launch (``doctor --url --trace``)
    version_path: str | None = None
    # where a running server says the context one request gets, beyond /v1/models'
    # ``max_model_len`` (GET path, read by ``served_context_from``; None: nowhere)
    context_path: str | None = None

    def profiler_dir_of(self, log_args: Mapping[str, object]) -> str | None:
        """The trace directory a running server was started with, as its start-up log's
        non-default arguments show it (None: not shown, or this engine has no such flag)."""
        return None

    # ---- what the server was told to load ------------------------------------------------
    # the load formats that fill the weights with random values (vLLM and SGLang:
    # ``--load-format dummy``, model_executor/model_loader/dummy_loader.py): the output is
    # noise by design, so the sanity gate's "broken" is expected and the timings still hold
    random_load_formats: tuple[str, ...] = ()

    def random_weights(self, argv: list[str], log_args: Mapping[str, object]) -> str | None:
        """Why the served weights are random (the flag or the log line that says so), or None.

        ``argv``: the variant's flags; ``log_args``: the start-up log's non-default args."""
        if not self.random_load_formats:
            return None
        fmt = None
        for i, tok in enumerate(argv):
            if tok in ("--load-format", "--load_format") and i + 1 < len(argv):
                fmt, where = argv[i + 1], "the variant"
            elif tok.startswith(("--load-format=", "--load_format=")):
                fmt, where = tok.split("=", 1)[1], "the variant"
        if fmt is None and log_args.get("load_format") is not None:
            fmt, where = str(log_args["load_format"]), "the start-up log"
        if fmt is None or fmt.lower() not in self.random_load_formats:
            return None
        return f"random weights (--load-format {fmt}, from {where}): timing only"

    def step_gap(
        self,
        facts: EngineFacts,
        hardware: Any,
        step_ms: float,
        context: int,
        evidence: Mapping[str, str | None],
    ) -> BandwidthGap | None:
        """This engine's own split of a measured one-stream step (the verdict's gap), from the
        doctor's ``evidence`` files; None: it has none (llama-server on a GPU has one)."""
        return None

    # ---- install -------------------------------------------------------------------------
    def locate(self, variant: Variant) -> EngineInstall:
        """Find the engine for ``variant``: its ``python``/``command``, else ``.engines/<name>``."""
        if variant.command:
            exe = variant.command[0]
            if not (Path(exe).exists() or shutil.which(exe)):
                raise CeilingError(
                    f"{self.name}: command {exe!r} from the variant does not exist",
                    fix="fix `command:` in the variant, or set `python:` to the engine's python",
                )
            python = python_path(variant) if variant.python else None
            return EngineInstall(
                python=python, command=list(variant.command), env=dict(variant.env)
            )
        candidates: list[Path] = []
        if variant.python:
            candidates.append(python_path(variant))
        home = self.install_dir or self.name
        env_py = os.environ.get(f"CEILING_{home.upper().replace('-', '_')}_PYTHON")
        if env_py:
            candidates.append(Path(env_py))
        for root in search_roots(variant):
            candidates.append(root / ".engines" / home / "bin" / "python")
        for py in candidates:
            if py.exists():
                install = EngineInstall(python=py, env=dict(variant.env))
                self._fill_version(install)
                if install.version is not None:
                    return install
        tried = ", ".join(str(c) for c in candidates[:3]) or "nothing"
        raise CeilingError(
            f"engine {self.name!r} is not installed (looked for {tried})",
            fix=self.install_hint(),
        )

    def install_hint(self) -> str:
        return f"install {self.name} into .engines/{self.name}, or set `python:` in the variant"

    def _fill_version(self, install: EngineInstall) -> None:
        """Ask the engine's Python which distribution/version it has (fast: metadata only)."""
        if install.python is None:
            return
        info = dist_versions(str(install.python), self.dist_names, import_env(install.env))
        for dist in self.dist_names:
            if info.get(dist):
                install.version = info[dist]
                install.dist = dist
                return

    # ---- command line --------------------------------------------------------------------
    def server_argv(self, install: EngineInstall) -> list[str]:
        """The server command before the model (``command``, else ``python -m server_module``)."""
        if install.command:
            return list(install.command)
        return [str(install.python), "-m", self.server_module]

    def launch_command(self, variant: Variant, install: EngineInstall, port: int) -> LaunchPlan:
        """The server command, the model, the served name, host and port, then the user's flags.

        The served name, host and port are added only when the variant's flags do not set them.
        """
        argv = [*self.server_argv(install)]
        argv += [self.model_flag, variant.model] if self.model_flag else [variant.model]
        user = variant.argv()
        if variant.served_model_name and not has_flag(user, self.served_name_flag):
            argv += [self.served_name_flag, variant.served_model_name]
        if not has_flag(user, "--host"):
            argv += ["--host", variant.host]
        if not has_flag(user, "--port"):
            argv += ["--port", str(port)]
        return LaunchPlan(argv=[*argv, *user], env={}, notes=list(install.notes))

    # ---- flags ---------------------------------------------------------------------------
    def dump_flags(self, install: EngineInstall) -> FlagTable:
        """Ask the installed engine for its flags (slow: imports the engine). Uncached.

        By default the engine's own parser, imported in its Python by ``data/dump_args.py``.
        """
        if install.python is None:
            raise CeilingError(
                f"cannot ask {self.display_name} for its flags without its Python",
                fix=f"set `python:` in the variant to the environment that has {self.display_name}",
            )
        table, why = self.dump_flags_with_parser(install)
        if table is None:
            raise CeilingError(
                f"could not read {self.display_name}'s flags from {install.python}: {why}",
                fix=f"check that `import {self.flags_module}` works in that environment",
            )
        return table

    def dump_flags_with_parser(self, install: EngineInstall) -> tuple[FlagTable | None, str]:
        """Run ``data/dump_args.py <name>`` in the engine's Python: (table, "") or (None, why)."""
        proc = subprocess.run(
            [str(install.python), str(DUMP_SCRIPT), self.name],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env=quiet_env(install.env),
        )
        if proc.returncode != 0:
            return None, (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        data = json.loads(proc.stdout)
        data["version"] = install.version or data.get("version", "unknown")
        return FlagTable.model_validate(data), ""

    def flag_table(self, install: EngineInstall, refresh: bool = False) -> FlagTable:
        """The engine's flags, cached per (engine, version, python) under the user cache dir.

        A table read from the engine's parser depends only on the Python that imports it, so
        it is kept under a key without the launch command (variants wrapping the engine in a
        script of their own share it); one parsed from ``--help`` text depends on the command
        and is kept under a key that includes it."""
        folder = cache_dir() / "flags"
        stem = f"{self.name}-{install.version or 'unknown'}"

        def key(*parts: object) -> Path:
            digest = hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:12]
            return folder / f"{stem}-{digest}.json"

        by_parser = key(install.python, install.dist) if install.python is not None else None
        by_command = key(install.python, install.command, install.dist)
        if not refresh:
            for path in (by_parser, by_command):
                if path is None or not path.exists():
                    continue
                try:
                    table = FlagTable.model_validate_json(read_text(path, "flag cache", fix="-"))
                except (CeilingError, ValueError):
                    continue  # corrupt cache: rebuild it
                table.cache_path, table.cache_hit = str(path), True
                return table
        table = self.dump_flags(install)
        path = by_parser if table.source == "parser" and by_parser is not None else by_command
        kept = write_cache(path, table.model_dump_json(), what="flag cache")
        table.cache_path, table.cache_hit = (str(kept) if kept else None), False
        return table

    def _removed(self) -> RemovedFlagsFile:
        return removed_flags_table(self.name)

    def removed_flags(self) -> dict[str, RemovedFlag]:
        """Flags the engine removed or renamed: name -> when, why, what instead."""
        return self._removed().flags

    def renamed_config_keys(self) -> dict[str, RemovedFlag]:
        """Renamed keys inside JSON-valued flags (e.g. compilation config ``level`` -> ``mode``)."""
        return self._removed().config_keys

    def canonical_flag(self, arg: Arg, lookup: dict[str, FlagSpec]) -> tuple[str, list[str]]:
        """The flag spelled the way the engine's parser sees it (``--max_model_len`` ->
        ``--max-model-len``; a ``.key`` path after it is kept), and its values."""
        if arg.flag.startswith("--"):
            head, dot, tail = arg.flag[2:].partition(".")
            return "--" + head.replace("_", "-") + dot + tail, arg.values
        return arg.flag, arg.values

    def flag_problems(self, arg: Arg, flag: str, version: str) -> list[Problem]:
        """What this engine says about ``arg`` (spelled ``flag``) beyond its parser (none)."""
        return []

    def value_type(self, name: str | None) -> ValueType | None:
        """The value type ``name`` of this engine's parser (None: not checked)."""
        return self.value_types.get(name or "") or VALUE_TYPES.get(name or "")

    # ---- environment (ceiling env / deploy) -------------------------------------------------
    def tensor_parallel(self, variant: Variant) -> int:
        """The tensor-parallel size the variant asks for (1 when it sets none)."""
        args = variant.argv()
        for i, tok in enumerate(args):
            for flag in self.tp_flags:
                if tok == flag and i + 1 < len(args) and args[i + 1].isdigit():
                    return int(args[i + 1])
                if tok.startswith(flag + "=") and tok.split("=", 1)[1].isdigit():
                    return int(tok.split("=", 1)[1])
        return 1

    def gpus_for(self, variant: Variant) -> int:
        """The GPUs the variant runs on: 0 when it asks for the CPU (:attr:`cpu_flags`,
        :attr:`cpu_env_prefixes`), else its tensor-parallel size."""
        values: dict[str, str] = {}
        args = variant.argv()
        for i, tok in enumerate(args):
            if tok.startswith("-"):
                flag, _, value = tok.partition("=")
                nxt = args[i + 1] if i + 1 < len(args) else ""
                values[flag] = value or ("" if nxt.startswith("-") else nxt) or "true"
        for flag, cpu_values in self.cpu_flags.items():
            if values.get(flag, "") in cpu_values:
                return 0
        if any(k.startswith(self.cpu_env_prefixes) for k in variant.env if self.cpu_env_prefixes):
            return 0
        return self.tensor_parallel(variant)

    def image_for(self, install: EngineInstall) -> str | None:
        """The published container image of this install's version (None: none known)."""
        if not self.container_image:
            return None
        version = (install.version or "latest").split("+")[0]
        return self.container_image.format(version=version)

    def env_waivers(self, torch_version: str | None) -> dict[str, str]:
        """Requirements this engine's install leaves out on purpose, for this torch build."""
        if self.intended_absent and torch_version and self.intended_absent_when in torch_version:
            return dict(self.intended_absent)
        return {}

    # ---- its own profiler (``ceiling trace capture``, ``doctor --trace``) -------------------
    def profiler(
        self, version: str | None, trace_dir: Path, steps: int, prefix: str = "ceiling"
    ) -> ProfilerSetup:
        """How this engine at ``version`` records a window of ``steps`` engine steps into
        ``trace_dir`` (files named after ``prefix`` where the engine allows). The base answer:
        ceiling knows no profiler of this engine."""
        return unsupported(
            self.name,
            version,
            f"ceiling knows no way to make {self.display_name or self.name} record its own kernels",
            alternative="time the step from outside (the bench) only",
        )

    # ---- sanity requests -----------------------------------------------------------------
    def token_ids_request(self) -> dict[str, Any]:
        """Fields that make a completion carry its token ids (none by default)."""
        return {}

    def prompt_logprobs_request(self) -> dict[str, Any]:
        """Fields of a completion request that return the prompt's log-probabilities (and the
        most likely token at each position): the OpenAI legacy ``echo`` + ``logprobs``."""
        return {"echo": True, "logprobs": 1, **self.token_ids_request()}

    def served_context_from(self, answer: Any) -> int | None:
        """The context one request gets, from the answer to ``GET context_path``."""
        return None

    def read_prompt_logprobs(self, response: dict[str, Any]) -> PromptLogprobs | None:
        """The prompt's log-probabilities from the answer to ``prompt_logprobs_request``."""
        choices = response.get("choices") or [{}]
        usage = response.get("usage") or {}
        return read_openai_echo(choices[0], usage.get("prompt_tokens"))

    # ---- logs ----------------------------------------------------------------------------
    def phase_of(self, line: str) -> str | None:
        """A short description of the start-up phase this log line shows, if any."""
        if self.log_grammar is not None and self.log_grammar.prefix is not None:
            line = self.log_grammar.prefix.sub("", line)
        if self.shard_progress is not None:
            m = self.shard_progress.search(line)
            if m:
                return f"loading weights {m.group(2)}/{m.group(3)} shards"
        for pattern, phase in self.log_phases:
            if pattern.search(line):
                return phase
        return None

    # what the diagnosis reads of the engine is data (diagnosis_data.py), read here too
    @property
    def reading(self) -> EngineReading | None:
        """Its log grammar and marker, its findings' fixes, how it streams (None: no grammar)."""
        return next((r for r in READINGS if r.name == self.name), None)

    @property
    def log_grammar(self) -> LogGrammar | None:
        return self.reading.grammar if self.reading else None

    @property
    def finding_fixes(self) -> Mapping[str, str]:
        return self.reading.finding_fixes if self.reading else {}

    @property
    def facts_env(self) -> tuple[str, ...]:
        return self.reading.facts_env if self.reading else ()

    @property
    def streaming(self) -> StreamingTraits | None:
        return self.reading.streaming if self.reading else None

    def claims_log(self, lines: list[str]) -> bool:
        """Whether ``lines`` (ANSI colour removed) are this engine's start-up log."""
        return self.reading is not None and self.reading.claims_log(lines)

    def reads_logs(self) -> bool:
        """Whether this adapter has a start-up log grammar."""
        return self.reading is not None

    def parse_log(self, lines: list[str], facts: EngineFacts) -> None:
        """Fill ``facts`` from the start-up log ``lines`` (ANSI colour and ``\\r`` removed)."""
        if self.reading is None:
            raise NotImplementedError(f"{self.name}: no start-up log grammar")
        self.reading.parse_log(lines, facts)


def load_data(name: str, schema: type[M]) -> M:
    """A YAML table shipped in ``ceiling/engines/data``, validated by ``schema``."""
    return load_yaml(name, folder="engines/data", schema=schema)
