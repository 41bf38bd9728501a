"""vLLM's start-up log grammar (``ceiling inspect``): lines -> EngineFacts.

Covers vLLM 0.10 to current: lines with or without a ``(APIServer pid=N)`` /
``(EngineCore_DP0 pid=N)`` prefix, the compilation config printed as JSON in older releases and
as a Python repr in newer ones. The adapter (``vllm.py``) calls :func:`parse_vllm_log`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ceiling.engines.logparse import (
    MAX_MESSAGES,
    NUM,
    as_bool,
    as_int,
    balanced,
    kv_pairs,
    num,
    parse_config_repr,
    shorten,
    unquote,
)

if TYPE_CHECKING:
    from ceiling.diagnose.facts import EngineFacts


def parse_vllm_log(lines: list[str], facts: EngineFacts) -> None:
    """Fill ``facts`` from vLLM start-up log lines (ANSI colour and ``\\r`` removed)."""
    _parse_vllm(lines, facts)


# ---- start-up log grammar (``ceiling inspect``) ------------------------------------------

_VLLM_LINE = re.compile(
    r"^(?:\((?P<proc>[^)]*?)\s*pid=(?P<pid>\d+)\)\s+)?"
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d\s+[\d:.]+\s+"
    r"\[(?P<src>[^\]]+)\]\s?(?P<msg>.*)$"
)

_V_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("version_banner", re.compile(r"version (\d+\.\d+\.\d+\S*)")),
    ("version_api", re.compile(r"vLLM API server version (\S+)")),
    (
        "engine_config",
        re.compile(r"Initializing a (V1 )?LLM engine \(v?([^)]+)\) with config: (.*)$"),
    ),
    ("non_default", re.compile(r"non-default args: (\{.*\})\s*$")),
    ("platform", re.compile(r"Automatically detected platform (\w+)")),
    ("arch", re.compile(r"Resolved architecture: (\S+)")),
    ("max_len", re.compile(r"Using max model len (\d+)")),
    (
        "attn",
        re.compile(
            r"Using (?:AttentionBackendEnum\.|_Backend\.)?([A-Z][A-Za-z0-9_]*(?: [A-Z][A-Za-z0-9_]*)*)"
            r" (?:attention )?backend(?: on V1 engine)?(?: out of potential backends.*)?\.?\s*$"
        ),
    ),
    (
        "linear_kernel",
        re.compile(r"(?:Using|Selected) (\w+Kernel) for ([\w-]+)(?: (?:GEMM|linear))?"),
    ),
    ("wo_fallback", re.compile(r"does not have native support for (FP4|FP8) computation")),
    (
        "ar_fusion_off",
        re.compile(
            r"AllReduce fusion pass is disabled\.|Flashinfer allreduce fusion is not supported"
            r"|Flashinfer is not installed or comm module not found, skipping allreduce fusion"
        ),
    ),
    ("emulation", re.compile(r"NVFP4 linear falling back to the slow and unoptimized emulation")),
    (
        "spec",
        re.compile(
            r"SpecDecoding metrics: Mean acceptance length: ([\d.]+).*?"
            r"Avg Draft acceptance rate: ([\d.]+|nan)%"
        ),
    ),
    ("moe_method", re.compile(r"Using (\w+MoE\w*Method)\b")),
    (
        "moe_backend",
        re.compile(r"Using ([\w' -]+?) (?:MoE backend|backend for MoE)|MoE backend: (\S+)"),
    ),
    ("default_moe", re.compile(r"Using default MoE config\. Performance might be sub-optimal")),
    (
        "custom_ar",
        re.compile(r"Custom allreduce is disabled(?: because| due to)? (.*?)(?:\. To silence.*)?$"),
    ),
    ("nccl", re.compile(r"vLLM is using nccl==(\S+)|NCCL version (\d+\.\d+\.\d+)")),
    ("weights", re.compile(r"Loading weights took " + NUM + r" s")),
    (
        "model_load",
        re.compile(r"Model loading took " + NUM + r" ?GiB(?: memory)? and " + NUM + r" s"),
    ),
    ("kv_tokens", re.compile(r"(?:GPU|CPU|XPU|TPU)? ?KV cache size: " + NUM + r" tokens")),
    (
        "max_conc",
        re.compile(r"Maximum concurrency for " + NUM + r" tokens per request: " + NUM + r"x"),
    ),
    (
        "kv_mem",
        re.compile(
            r"Available KV cache memory: "
            + NUM
            + r" GiB|(?:set|Explicitly set) \(?"
            + NUM
            + r"(?:/[\d.]+\)?)? GiB for KV cache"
        ),
    ),
    (
        "graph",
        re.compile(r"Graph capturing finished in " + NUM + r" secs?(?:, took " + NUM + r" GiB)?"),
    ),
    ("compile_total", re.compile(r"torch\.compile t(?:akes|ook) " + NUM + r" s in total")),
    (
        "compile_hit",
        re.compile(
            r"Directly load (?:the compiled graph|AOT compil)|loaded? (?:the )?compiled (?:graph|function).* from (?:the )?cache|Loaded AOT compiled"
        ),
    ),
    (
        "compile_miss",
        re.compile(
            r"Compiling a graph for|Compiling model again due to a load failure|saved AOT compiled function|Cache the graph .* for later use"
        ),
    ),
    (
        "init",
        re.compile(r"init engine \(profile, create kv cache, warmup model\) took " + NUM + r" s"),
    ),
    ("fusions", re.compile(r"Enabled custom fusions: (.*)$")),
    (
        "eager",
        re.compile(r"Enforce eager set|enforce_eager=True|CUDA graph is not supported.*eager"),
    ),
    (
        "partial_cg",
        re.compile(
            r"is not supported with .*(?:PIECEWISE|piecewise)|Truncating max_cudagraph_capture_size|falling back to PIECEWISE|downgrad\w* .*cudagraph",
            re.I,
        ),
    ),
    (
        "fp8_kv",
        re.compile(
            r"(?:fp8|FP8)[\w ]*(?:kv|KV)[- ]?cache[^.]*(?:not supported|unsupported|is not available)|does not support (?:the )?(?:fp8|FP8)[\w ]*(?:kv|KV)",
            re.I,
        ),
    ),
    ("unknown_env", re.compile(r"Unknown vLLM environment variable detected: (\S+)")),
    ("ready", re.compile(r"Application startup complete")),
]


def _parse_vllm(lines: list[str], facts: EngineFacts) -> None:
    first_ts = last_ts = None
    for raw in lines:
        m = _VLLM_LINE.match(raw)
        msg = m.group("msg") if m else raw
        level = m.group("level") if m else None
        if m:
            ts = re.search(r"\d\d-\d\d\s+(\d\d):(\d\d):(\d\d)", raw)
            if ts:
                secs = int(ts.group(1)) * 3600 + int(ts.group(2)) * 60 + int(ts.group(3))
                first_ts = secs if first_ts is None else first_ts
                last_ts = secs if not facts.ready else last_ts
        if level == "WARNING" and len(facts.warnings) < MAX_MESSAGES:
            if msg not in facts.warnings:
                facts.warnings.append(msg)
        elif level in ("ERROR", "CRITICAL") and len(facts.errors) < MAX_MESSAGES:
            facts.errors.append(msg)
        elif (
            not m and re.match(r"^\w*(Error|Exception): ", raw) and len(facts.errors) < MAX_MESSAGES
        ):
            facts.errors.append(raw.strip())
        for key, pattern in _V_PATTERNS:
            hit = pattern.search(msg)
            if hit:
                _apply_vllm(key, hit, raw.strip(), facts)
    if first_ts is not None and last_ts is not None and facts.ready:
        facts.startup_s = float((last_ts - first_ts) % 86400)


def _apply_vllm(key: str, hit: re.Match[str], line: str, facts: EngineFacts) -> None:
    g = hit.groups()
    if (key == "version_banner" and "█" in line and facts.version is None) or (
        key == "version_api" and facts.version is None
    ):
        facts.version = g[0]
    elif key == "engine_config":
        facts.v1 = bool(g[0]) or facts.v1
        facts.version = facts.version or g[1].lstrip("v")
        _apply_engine_config(g[2], line, facts)
    elif key == "non_default":
        parsed = parse_config_repr(g[0])
        if isinstance(parsed, dict):
            facts.non_default_args = parsed
            facts.add_evidence("non_default", shorten(line, "non-default args"))
            if parsed.get("enable_expert_parallel"):
                facts.expert_parallel = True
            if parsed.get("enforce_eager"):
                facts.enforce_eager = True
                facts.add_evidence("eager", line)
    elif key == "platform":
        facts.device = g[0].lower()
    elif key == "arch":
        facts.architecture = g[0]
    elif key == "max_len":
        facts.max_model_len = int(g[0])
    elif key == "attn":
        name = g[0]
        if name.upper() in ("KV", "MOE") or "MoE" in line:
            return
        facts.attention_backend = name
        facts.mla = "MLA" in name.upper() or facts.mla
        facts.add_evidence("attention", line)
    elif key == "linear_kernel":
        facts.linear_kernel = f"{g[1]} -> {g[0]}"
        facts.quant_scheme = facts.quant_scheme or g[1]
        facts.add_evidence("linear_kernel", line)
    elif key == "moe_method":
        facts.moe_kernel = g[0]
        facts.add_evidence("linear_kernel", line)
    elif key == "moe_backend":
        facts.moe_backend = (g[0] or g[1] or "").replace("'", "").strip()
        facts.add_evidence("moe", line)
    elif key == "default_moe":
        facts.add_evidence("default_moe_config", line)
    elif key == "custom_ar":
        facts.custom_allreduce_disabled = True
        facts.custom_allreduce_reason = g[0].strip().rstrip(".")
        facts.add_evidence("custom_allreduce", line)
    elif key == "nccl":
        facts.nccl_version = g[0] or g[1]
    elif key == "weights":
        facts.weights_load_s = num(g[0])
        facts.add_evidence("load", line)
    elif key == "model_load":
        facts.model_memory_gib = num(g[0])
        facts.model_load_s = num(g[1])
        facts.add_evidence("load", line)
    elif key == "kv_tokens":
        facts.kv_cache_tokens = int(num(g[0]))
        facts.add_evidence("kv", line)
    elif key == "max_conc":
        facts.max_concurrency_tokens_per_request = int(num(g[0]))
        facts.max_concurrency = num(g[1])
        facts.add_evidence("kv", line)
    elif key == "kv_mem":
        facts.kv_cache_memory_gib = num(g[0] or g[1])
        facts.add_evidence("kv", line)
    elif key == "graph":
        facts.graph_capture_s = num(g[0])
        if g[1]:
            facts.graph_capture_gib = num(g[1])
        facts.add_evidence("graphs", line)
    elif key == "compile_total":
        facts.torch_compile_s = num(g[0])
        facts.add_evidence("compile_cache", line)
    elif key == "compile_hit":
        if facts.compile_cache_hit is None:
            facts.compile_cache_hit = True
        facts.add_evidence("compile_cache", line)
    elif key == "compile_miss":
        facts.compile_cache_hit = False
        facts.add_evidence("compile_cache", line)
    elif key == "init":
        facts.init_engine_s = num(g[0])
        comp = re.search(r"\(compilation: " + NUM + " s", line)  # vLLM >= 0.2x
        if comp and facts.torch_compile_s is None:
            facts.torch_compile_s = num(comp.group(1))
        facts.add_evidence("init", line)
    elif key == "fusions":
        facts.enabled_fusions = [f.strip() for f in g[0].split(",") if f.strip()]
    elif key == "eager":
        facts.add_evidence("eager", line)
    elif key == "partial_cg":
        to = re.search(r"setting cudagraph_mode=(\w+)", line)
        if to:
            facts.cudagraph_downgrade = to.group(1)
        facts.add_evidence("partial_cudagraphs", line)
    elif key == "wo_fallback":
        facts.weight_only_fallback = g[0]
        facts.add_evidence("weight_only_fallback", line)
    elif key == "ar_fusion_off":
        facts.add_evidence("allreduce_fusion_off", line)
    elif key == "emulation":
        facts.add_evidence("quant_emulation", line)
    elif key == "spec":
        facts.spec_mean_acceptance = float(g[0])
        facts.spec_acceptance_rate_pct = None if g[1] == "nan" else float(g[1])
        facts.add_evidence("spec_decode", line)
    elif key == "fp8_kv":
        facts.add_evidence("fp8_kv_unavailable", line)
    elif key == "unknown_env":
        facts.add_evidence("unknown_env", line)
    elif key == "ready":
        facts.ready = True


def _apply_engine_config(text: str, line: str, facts: EngineFacts) -> None:
    """``model='...', tensor_parallel_size=8, ..., compilation_config={...}`` (V1 config line)."""
    kv = kv_pairs(text)
    facts.model = facts.model or unquote(kv.get("model"))
    facts.served_model_name = unquote(kv.get("served_model_name")) or facts.served_model_name
    facts.dtype = (kv.get("dtype") or "").replace("torch.", "") or facts.dtype
    facts.max_model_len = as_int(kv.get("max_seq_len")) or facts.max_model_len
    facts.tensor_parallel_size = as_int(kv.get("tensor_parallel_size"))
    facts.pipeline_parallel_size = as_int(kv.get("pipeline_parallel_size"))
    facts.data_parallel_size = as_int(kv.get("data_parallel_size"))
    facts.decode_context_parallel_size = as_int(kv.get("decode_context_parallel_size"))
    quant = unquote(kv.get("quantization"))
    facts.quantization = None if quant in (None, "None") else quant
    kvd = unquote(kv.get("kv_cache_dtype"))
    facts.kv_cache_dtype = kvd
    facts.device = unquote(kv.get("device_config")) or facts.device
    ar = as_bool(kv.get("disable_custom_all_reduce"))
    if ar and facts.custom_allreduce_disabled is None:
        facts.custom_allreduce_disabled = True
        facts.custom_allreduce_reason = "disable_custom_all_reduce=True in the engine config"
        facts.add_evidence("custom_allreduce", shorten(line, "disable_custom_all_reduce=True"))
    if as_bool(kv.get("enable_expert_parallel")):
        facts.expert_parallel = True
    eager = as_bool(kv.get("enforce_eager"))
    if eager is not None:
        facts.enforce_eager = eager
        if eager:
            facts.add_evidence("eager", shorten(line, "enforce_eager=True"))
    cc_start = text.find("compilation_config=")
    if cc_start >= 0:
        brace = text.find("{", cc_start)
        if brace >= 0:
            cc = parse_config_repr(balanced(text, brace))
            if isinstance(cc, dict):
                _apply_compilation(cc, facts)
                facts.add_evidence("compilation", shorten(line, "compilation_config="))


def _apply_compilation(cc: dict[str, Any], facts: EngineFacts) -> None:
    mode = cc.get("mode", cc.get("level"))
    if mode is not None:
        names = {0: "NONE", 1: "STOCK_TORCH_COMPILE", 2: "DYNAMO_TRACE_ONCE", 3: "VLLM_COMPILE"}
        facts.compilation_mode = names.get(mode, str(mode)) if isinstance(mode, int) else str(mode)
    cg = cc.get("cudagraph_mode")
    if cg is not None:
        facts.cudagraph_mode = (
            {0: "NONE", 1: "PIECEWISE", 2: "FULL"}.get(cg, str(cg))
            if isinstance(cg, int)
            else str(cg)
        )
    elif "use_cudagraph" in cc:  # vLLM 0.10: a boolean
        facts.cudagraph_mode = "PIECEWISE" if cc.get("use_cudagraph") else "NONE"
    sizes = cc.get("cudagraph_capture_sizes")
    if isinstance(sizes, list):
        facts.cudagraph_capture_sizes = [int(s) for s in sizes if isinstance(s, int)]
    mx = cc.get("max_cudagraph_capture_size") or cc.get("max_capture_size")
    if isinstance(mx, int):
        facts.max_cudagraph_capture_size = mx
    ops = cc.get("custom_ops")
    if isinstance(ops, list):
        facts.custom_ops = [str(o) for o in ops]
    pc = cc.get("pass_config")
    if isinstance(pc, dict):
        passes = {
            k: bool(v)
            for k, v in pc.items()
            if isinstance(v, bool) and (k.startswith(("fuse_", "enable_", "eliminate")))
        }
        facts.fusion_passes = passes
