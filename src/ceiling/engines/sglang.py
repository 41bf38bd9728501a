"""SGLang adapter: ``python -m sglang.launch_server``, flags from ``ServerArgs``, logs, metrics.

SGLang's flags come from ``ServerArgs.add_cli_args`` imported in the engine's Python (see
``data/dump_args.py``); its log lines look like ``[2026-05-12 11:00:05 TP0] Load weight begin.``
(the start-up grammar also reads ``server_args=ServerArgs(...)``) and readiness is "The server is
fired up and ready to roll!" plus ``/health``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ceiling.engines.base import Engine
from ceiling.engines.logparse import (
    MAX_MESSAGES,
    NUM,
    as_bool,
    as_int,
    kv_pairs,
    literal,
    num,
    shorten,
    unquote,
)

if TYPE_CHECKING:
    from ceiling.diagnose.facts import EngineFacts

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

    def parse_log(self, lines: list[str], facts: EngineFacts) -> None:
        _parse_sglang(lines, facts)

    def token_ids_request(self) -> dict[str, Any]:
        """SGLang's completions: ``return_token_ids`` (-> ``return_prompt_token_ids``); prompt
        log-probabilities come from the OpenAI ``echo`` + ``logprobs`` pair, which sets
        ``logprob_start_len=0`` (sglang/srt/entrypoints/openai/serving_completions.py,
        ``_convert_to_internal_request``)."""
        return {"return_token_ids": True}


# ---- start-up log grammar (``ceiling inspect``) ------------------------------------------

_SGLANG_LINE = re.compile(
    r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?: (?P<rank>[^\]]+))?\] (?P<msg>.*)$"
)

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


_S_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("server_args", re.compile(r"server_args=ServerArgs\((.*)\)\s*$")),
    ("version", re.compile(r"sglang(?: version)?[=: ]+v?(\d+\.\d+\.\d+\S*)", re.I)),
    (
        "weights_end",
        re.compile(r"Load weight end\. .*?mem usage=" + NUM + r" GB"),
    ),
    (
        "weights_time",
        re.compile(r"Load weight end\. elapsed=" + NUM + r" s|Loading weights took " + NUM),
    ),
    (
        "kv_alloc",
        re.compile(r"KV Cache is allocated\. #tokens: " + NUM),
    ),
    (
        "max_tokens",
        re.compile(
            r"max_total_num_tokens="
            + NUM
            + r".*?max_running_requests="
            + NUM
            + r"(?:.*?context_len="
            + NUM
            + ")?"
        ),
    ),
    (
        "graph_end",
        re.compile(
            r"Capture cuda graph end\. Time elapsed: " + NUM + r" s\. mem usage=" + NUM + r" GB"
        ),
    ),
    ("graph_bs", re.compile(r"Capture cuda graph bs \[([\d, ]+)\]")),
    ("attn", re.compile(r"(?:attention backend|Attention backend)[^.]*?(?:Use |: ?)(\w+)")),
    ("mla", re.compile(r"MLA optimization is turned on")),
    ("custom_ar", re.compile(r"[Cc]ustom allreduce is disabled(?: because| due to)? ?(.*)$")),
    ("ready", re.compile(r"The server is fired up and ready to roll")),
    ("nccl", re.compile(r"NCCL version (\d+\.\d+\.\d+)|nccl==(\S+)")),
]


def _parse_sglang(lines: list[str], facts: EngineFacts) -> None:
    from datetime import datetime

    first = last = None
    for raw in lines:
        m = _SGLANG_LINE.match(raw)
        msg = m.group("msg") if m else raw
        if m:
            ts = datetime.strptime(m.group("ts"), "%Y-%m-%d %H:%M:%S")
            first = first or ts
            if not facts.ready:
                last = ts
        if re.search(r"\bWARNING\b|Warning:", raw) and len(facts.warnings) < MAX_MESSAGES:
            facts.warnings.append(msg.strip())
        if re.search(r"\bERROR\b|Traceback|^\w*Error: ", raw) and len(facts.errors) < MAX_MESSAGES:
            facts.errors.append(msg.strip())
        for key, pattern in _S_PATTERNS:
            hit = pattern.search(msg)
            if hit:
                _apply_sglang(key, hit, raw.strip(), facts)
    if first and last and facts.ready:
        facts.startup_s = (last - first).total_seconds()


def _apply_sglang(key: str, hit: re.Match[str], line: str, facts: EngineFacts) -> None:
    g = hit.groups()
    if key == "server_args":
        kv = kv_pairs(g[0])
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
                facts.add_evidence("eager", shorten(line, "disable_cuda_graph=True"))
        if as_bool(kv.get("disable_custom_all_reduce")):
            facts.custom_allreduce_disabled = True
            facts.custom_allreduce_reason = "disable_custom_all_reduce=True in server_args"
            facts.add_evidence("custom_allreduce", shorten(line, "disable_custom_all_reduce"))
        facts.device = unquote(kv.get("device")) or facts.device
        # SGLang prints every field; keep the ones that shape performance, as Python values.
        facts.non_default_args = {k: literal(v) for k, v in kv.items() if k in _SGLANG_KEY_ARGS}
    elif key == "version":
        facts.version = facts.version or g[0]
    elif key == "weights_end":
        facts.model_memory_gib = num(g[0])  # SGLang's "GB" are GiB (bytes / 2**30)
        arch = re.search(r"type=(\w+)", line)
        facts.architecture = arch.group(1) if arch else facts.architecture
        facts.add_evidence("load", line)
    elif key == "weights_time":
        facts.weights_load_s = num(g[0] or g[1])
        facts.add_evidence("load", line)
    elif key == "kv_alloc":
        # "#tokens: N, KV size: X GB" (MLA) or "#tokens: N, K size: X GB, V size: Y GB"
        facts.kv_cache_tokens = int(num(g[0]))
        sizes = re.findall(r"\b(?:KV|K|V) size: " + NUM + " GB", line)
        if sizes:
            facts.kv_cache_memory_gib = round(sum(num(x) for x in sizes), 2)
        facts.add_evidence("kv", line)
    elif key == "max_tokens":
        facts.kv_cache_tokens = int(num(g[0]))
        if g[2]:
            ctx = int(num(g[2]))
            facts.max_model_len = facts.max_model_len or ctx
            facts.max_concurrency_tokens_per_request = ctx
            facts.max_concurrency = round(num(g[0]) / ctx, 2)
        facts.add_evidence("kv", line)
    elif key == "graph_end":
        facts.graph_capture_s = num(g[0])
        facts.graph_capture_gib = num(g[1])
        facts.add_evidence("graphs", line)
    elif key == "graph_bs":
        facts.cudagraph_capture_sizes = [int(x) for x in g[0].replace(" ", "").split(",") if x]
        facts.max_cudagraph_capture_size = max(facts.cudagraph_capture_sizes or [0]) or None
    elif key == "attn":
        facts.attention_backend = facts.attention_backend or g[0]
        facts.add_evidence("attention", line)
    elif key == "mla":
        facts.mla = True
    elif key == "custom_ar":
        facts.custom_allreduce_disabled = True
        facts.custom_allreduce_reason = g[0].strip() or facts.custom_allreduce_reason
        facts.add_evidence("custom_allreduce", line)
    elif key == "ready":
        facts.ready = True
    elif key == "nccl":
        facts.nccl_version = g[0] or g[1]
