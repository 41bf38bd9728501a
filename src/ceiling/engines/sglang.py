"""SGLang adapter: ``python -m sglang.launch_server``, flags from ``ServerArgs``, logs, metrics.

SGLang's flags come from ``ServerArgs.add_cli_args`` imported in the engine's Python (see
``data/dump_args.py``); its log lines look like ``[2026-05-12 11:00:05 TP0] Load weight begin.``
(the start-up grammar also reads ``server_args=ServerArgs(...)``) and readiness is "The server is
fired up and ready to roll!" plus ``/health``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ceiling.engines.base import Engine
from ceiling.engines.logparse import (
    NUM,
    LogGrammar,
    LogRead,
    Rule,
    as_bool,
    as_int,
    kv_pairs,
    literal,
    num,
    shorten,
    unquote,
)
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


# ---- start-up log grammar (``ceiling inspect``) ------------------------------------------

_SGLANG_KEY_ARGS = (
    "tp_size",
    "dp_size",
    "ep_size",
    "pp_size",
    "quantization",
    "kv_cache_dtype",
    "attention_backend",
    "mem_fraction_static",
    "cuda_graph_max_bs",
    "disable_cuda_graph",
    "chunked_prefill_size",
    "max_running_requests",
)


def _epoch(ts: str) -> float:
    """``2026-05-12 11:00:05`` -> seconds (read as UTC: only differences count)."""
    return datetime.strptime(ts, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def _server_args(hit: re.Match[str], r: LogRead) -> None:
    facts, line = r.facts, r.line
    kv = kv_pairs(hit[1])
    facts.model = unquote(kv.get("model_path"))
    facts.served_model_name = unquote(kv.get("served_model_name"))
    facts.tensor_parallel_size = as_int(kv.get("tp_size"))
    facts.pipeline_parallel_size = as_int(kv.get("pp_size"))
    facts.data_parallel_size = as_int(kv.get("dp_size"))
    facts.expert_parallel_size = as_int(kv.get("ep_size"))
    facts.expert_parallel = (facts.expert_parallel_size or 1) > 1 or None
    q = unquote(kv.get("quantization"))
    facts.quantization = None if q in (None, "None") else q
    facts.kv_cache_dtype = unquote(kv.get("kv_cache_dtype"))
    facts.dtype = unquote(kv.get("dtype"))
    facts.max_model_len = as_int(kv.get("context_length")) or facts.max_model_len
    ab = unquote(kv.get("attention_backend"))
    if ab and ab != "None":
        facts.attention_backend = ab
    moe = unquote(kv.get("moe_runner_backend"))
    if moe and moe != "None":
        facts.moe_backend = moe
    disable_cg = as_bool(kv.get("disable_cuda_graph"))
    if disable_cg is not None:
        facts.enforce_eager = disable_cg
        facts.cudagraph_mode = "NONE" if disable_cg else "FULL"
        if disable_cg:
            r.quote("eager", shorten(line, "disable_cuda_graph=True"))
    if as_bool(kv.get("disable_custom_all_reduce")):
        facts.custom_allreduce_disabled = True
        facts.custom_allreduce_reason = "disable_custom_all_reduce=True in server_args"
        r.quote("custom_allreduce", shorten(line, "disable_custom_all_reduce"))
    facts.device = unquote(kv.get("device")) or facts.device
    # SGLang prints every field; keep the ones that shape performance, as Python values.
    facts.non_default_args = {k: literal(v) for k, v in kv.items() if k in _SGLANG_KEY_ARGS}


def _weights_end(hit: re.Match[str], r: LogRead) -> None:
    r.facts.model_memory_gib = num(hit[1])  # SGLang's "GB" are GiB (bytes / 2**30)
    arch = re.search(r"type=(\w+)", r.line)
    r.facts.architecture = arch.group(1) if arch else r.facts.architecture


def _kv_alloc(hit: re.Match[str], r: LogRead) -> None:
    # "#tokens: N, KV size: X GB" (MLA) or "#tokens: N, K size: X GB, V size: Y GB"
    r.facts.kv_cache_tokens = int(num(hit[1]))
    sizes = re.findall(r"\b(?:KV|K|V) size: " + NUM + " GB", r.line)
    if sizes:
        r.facts.kv_cache_memory_gib = round(sum(num(x) for x in sizes), 2)


def _max_tokens(hit: re.Match[str], r: LogRead) -> None:
    r.facts.kv_cache_tokens = int(num(hit[1]))
    if hit[3]:
        ctx = int(num(hit[3]))
        r.facts.max_model_len = r.facts.max_model_len or ctx
        r.facts.max_concurrency_tokens_per_request = ctx
        r.facts.max_concurrency = round(num(hit[1]) / ctx, 2)


def _graph_end(hit: re.Match[str], r: LogRead) -> None:
    r.facts.graph_capture_s = num(hit[1])
    r.facts.graph_capture_gib = num(hit[2])


def _graph_sizes(hit: re.Match[str], r: LogRead) -> None:
    sizes = [int(x) for x in hit[1].replace(" ", "").split(",") if x]
    r.facts.cudagraph_capture_sizes = sizes
    r.facts.max_cudagraph_capture_size = max(sizes or [0]) or None


def _custom_allreduce(hit: re.Match[str], r: LogRead) -> None:
    r.facts.custom_allreduce_disabled = True
    r.facts.custom_allreduce_reason = hit[1].strip() or r.facts.custom_allreduce_reason


_RULES = (
    Rule(re.compile(r"server_args=ServerArgs\((.*)\)\s*$"), apply=_server_args),
    Rule(
        re.compile(r"sglang(?: version)?[=: ]+v?(\d+\.\d+\.\d+\S*)", re.I),
        field="version",
        first_only=True,
    ),
    Rule(
        re.compile(r"Load weight end\. .*?mem usage=" + NUM + r" GB"),
        apply=_weights_end,
        evidence="load",
    ),
    Rule(
        re.compile(r"Load weight end\. elapsed=" + NUM + r" s|Loading weights took " + NUM),
        field="weights_load_s",
        convert=num,
        evidence="load",
    ),
    Rule(re.compile(r"KV Cache is allocated\. #tokens: " + NUM), apply=_kv_alloc, evidence="kv"),
    Rule(
        re.compile(
            r"max_total_num_tokens="
            + NUM
            + r".*?max_running_requests="
            + NUM
            + r"(?:.*?context_len="
            + NUM
            + ")?"
        ),
        apply=_max_tokens,
        evidence="kv",
    ),
    Rule(
        re.compile(
            r"Capture cuda graph end\. Time elapsed: " + NUM + r" s\. mem usage=" + NUM + r" GB"
        ),
        apply=_graph_end,
        evidence="graphs",
    ),
    Rule(re.compile(r"Capture cuda graph bs \[([\d, ]+)\]"), apply=_graph_sizes),
    Rule(
        re.compile(r"(?:attention backend|Attention backend)[^.]*?(?:Use |: ?)(\w+)"),
        field="attention_backend",
        first_only=True,
        evidence="attention",
    ),
    Rule(re.compile(r"MLA optimization is turned on"), field="mla", value=True),
    Rule(
        re.compile(r"[Cc]ustom allreduce is disabled(?: because| due to)? ?(.*)$"),
        apply=_custom_allreduce,
        evidence="custom_allreduce",
    ),
    Rule(re.compile(r"The server is fired up and ready to roll"), field="ready", value=True),
    Rule(re.compile(r"NCCL version (\d+\.\d+\.\d+)|nccl==(\S+)"), field="nccl_version"),
)

#: SGLang's start-up log: ``[2026-05-12 11:00:05 TP0] message`` lines (no level: warnings and
#: errors by their words), start-up time to "The server is fired up and ready to roll"
SGLANG_LOG = LogGrammar(
    rules=_RULES,
    line=re.compile(
        r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?: (?P<rank>[^\]]+))?\] (?P<msg>.*)$"
    ),
    error=re.compile(r"\bERROR\b|Traceback|^\w*Error: "),
    warning=re.compile(r"\bWARNING\b|Warning:"),
    timestamp=_epoch,
)


class SglangEngine(Engine):
    """SGLang's HTTP server (``sglang.launch_server``)."""

    name = "sglang"
    random_load_formats = ("dummy",)
    display_name = "SGLang"
    finding_fixes = {  # noqa: RUF012 (class data, read only)
        "eager-mode": "remove --disable-cuda-graph; raise --cuda-graph-max-bs to the batch",
        "custom-allreduce-off.user": "remove --disable-custom-all-reduce",
        "kv-capacity.memory": "raise --mem-fraction-static",
        "kv-capacity.fp8": "--kv-cache-dtype fp8_e4m3",
        "kv-capacity.max-len": "a lower --context-length",
        "kv-capacity.fewer-seqs": "fewer sequences (--max-running-requests)",
        "concurrency-cap": "raise --max-running-requests",
        "partial-cudagraphs.size": "raise --cuda-graph-max-bs to the batch",
        "expert-parallel-pcie": "drop --ep-size (experts sharded by TP)",
    }
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
    log_marker = re.compile(r"server_args=ServerArgs|sglang|The server is fired up")
    log_grammar = SGLANG_LOG
    log_claim_rank = 10  # before vLLM: SGLang's logs can mention vLLM, not the other way round
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
