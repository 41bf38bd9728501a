"""SGLang adapter: ``python -m sglang.launch_server``, flags from ``ServerArgs``, logs, metrics.

SGLang's flags come from ``ServerArgs.add_cli_args`` imported in the engine's Python (see
``data/dump_args.py``); its log lines look like ``[2026-05-12 11:00:05 TP0] Load weight begin.``
(the start-up grammar also reads ``server_args=ServerArgs(...)``) and readiness is "The server is
fired up and ready to roll!" plus ``/health``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ceiling.engines.base import Engine
from ceiling.engines.profiling import ProfilerSetup

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
    random_load_formats = ("dummy",)
    display_name = "SGLang"
    ignore_eos_field = "ignore_eos"
    ready_line = "The server is fired up and ready to roll!"
    default_port = 30000
    env_prefixes = ("SGLANG_",)
    dist_names = ("sglang",)
    tp_flags = ("--tp-size", "--tensor-parallel-size")
    container_image = "lmsysorg/sglang:v{version}"
    container_entrypoint = ("python3", "-m", "sglang.launch_server")
    server_module = "sglang.launch_server"
    model_flag = "--model-path"
    flags_module = "sglang.srt.server_args"
    log_phases = _PHASES
    shard_progress = _SHARDS
    metric_prefix = "sglang:"
    metric_histograms = {  # noqa: RUF012 (class data, read only)
        "ttft": ("sglang:time_to_first_token_seconds",),
        "itl": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        "queue": ("sglang:queue_time_seconds", "sglang:request_queue_time_seconds"),
        "e2el": ("sglang:e2e_request_latency_seconds",),
    }

    def install_hint(self) -> str:
        return (
            "install SGLang into .engines/sglang (`pip install 'sglang[all]'`), or point "
            "`python:` in the variant at the environment that has it"
        )

    def token_ids_request(self) -> dict[str, Any]:
        """SGLang's completions: ``return_token_ids`` (-> ``return_prompt_token_ids``); prompt
        log-probabilities come from the OpenAI ``echo`` + ``logprobs`` pair, which sets
        ``logprob_start_len=0`` (sglang/srt/entrypoints/openai/serving_completions.py,
        ``_convert_to_internal_request``)."""
        return {"return_token_ids": True}

    def profiler(
        self, version: str | None, trace_dir: Path, steps: int, prefix: str = "ceiling"
    ) -> ProfilerSetup:
        """SGLang's torch profiler: ``/start_profile`` is always served and its body names the
        output directory and the step count (``output_dir``, ``num_steps``, ``activities``;
        sglang/srt/managers/io_struct.py ``ProfileReqInput``, docs/developer_guide/
        benchmark_and_profiling.md); ``SGLANG_TORCH_PROFILER_DIR`` is the default directory
        and ``SGLANG_PROFILE_WITH_STACK=False`` drops Python stacks. One file per rank:
        ``<profile id>-TP-<rank>[-DP-..-PP-..-EP-..].trace.json.gz``. So a server ceiling did
        not launch can be traced too, when its files can be read from here."""
        folder = str(Path(trace_dir).expanduser().resolve())
        return ProfilerSetup(
            engine=self.name,
            version=version,
            supported=True,
            env={"SGLANG_TORCH_PROFILER_DIR": folder, "SGLANG_PROFILE_WITH_STACK": "False"},
            start_path="/start_profile",
            start_body={"output_dir": folder, "num_steps": steps, "activities": ["CPU", "GPU"]},
            stop_path="/stop_profile",
            bounded_by_engine=True,
            works_unlaunched=True,
            trace_dir=folder,
            file_patterns=["*.trace.json.gz", "*.trace.json"],
            exclude_patterns=["merged-*"],
            enable_hint=f"SGLang {version or '(version unknown)'}: profiling needs no flag "
            "(/start_profile takes output_dir); set SGLANG_TORCH_PROFILER_DIR=DIR on the "
            "server for the default directory, and read the files on the server's machine",
            source="sglang/srt/managers/io_struct.py ProfileReqInput, "
            "docs/developer_guide/benchmark_and_profiling.md",
            notes=["/stop_profile after a bounded window may answer that none is running"],
        )
