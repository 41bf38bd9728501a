"""SGLang's start-up log grammar (``ceiling inspect``), as data: ``SGLANG_LOG``.

Lines look like ``[2026-05-12 11:00:05 TP0] Load weight begin.``; ``server_args=ServerArgs(...)``
says the arguments. Pure data and the small functions that read a line: no I/O, so that
``ceiling.diagnose`` reads it (through ``diagnosis_data.py``) without the adapter (``sglang.py``).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

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
