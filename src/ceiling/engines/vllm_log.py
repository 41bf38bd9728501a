"""vLLM's start-up log grammar (``ceiling inspect``), as data: ``VLLM_LOG`` for the driver.

Covers vLLM 0.10 to current: lines with or without a ``(APIServer pid=N)`` /
``(EngineCore_DP0 pid=N)`` prefix, the compilation config printed as JSON in older releases and
as a Python repr in newer ones. ``diagnosis_data.py`` names it as vLLM's grammar, for the
diagnosis and the adapter (``vllm.py``) alike.
"""

from __future__ import annotations

import re
from typing import Any

from ceiling.engines.facts import EngineFacts
from ceiling.engines.logparse import (
    NUM,
    LogGrammar,
    LogRead,
    Rule,
    as_bool,
    as_int,
    balanced,
    kv_pairs,
    num,
    parse_config_repr,
    shorten,
    unquote,
)

_LINE = re.compile(
    r"^(?:\((?P<proc>[^)]*?)\s*pid=(?P<pid>\d+)\)\s+)?"
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(?P<ts>\d\d-\d\d\s+[\d:.]+)\s+"
    r"\[(?P<src>[^\]]+)\]\s?(?P<msg>.*)$"
)
_CLOCK = re.compile(r"(\d\d):(\d\d):(\d\d)")


def _seconds(ts: str) -> float | None:
    """``05-12 11:00:05`` -> seconds of the day (vLLM prints no year; fractions dropped)."""
    m = _CLOCK.search(ts)
    return None if m is None else float(int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]))


def _int(text: str) -> int:
    return int(num(text))


# ---- what the lines that need more than one field say -------------------------------------


def _banner_version(hit: re.Match[str], r: LogRead) -> None:
    if "█" in r.line and r.facts.version is None:  # the ASCII-art banner, not any "version"
        r.facts.version = hit[1]


def _engine_config(hit: re.Match[str], r: LogRead) -> None:
    r.facts.v1 = bool(hit[1]) or r.facts.v1
    r.facts.version = r.facts.version or hit[2].lstrip("v")
    _apply_engine_config(hit[3], r.line, r.facts)


def _non_default(hit: re.Match[str], r: LogRead) -> None:
    parsed = parse_config_repr(hit[1])
    if not isinstance(parsed, dict):
        return
    r.facts.non_default_args = parsed
    r.quote("non_default", shorten(r.line, "non-default args"))
    if parsed.get("enable_expert_parallel"):
        r.facts.expert_parallel = True
    if parsed.get("enforce_eager"):
        r.facts.enforce_eager = True
        r.quote("eager")


def _attention(hit: re.Match[str], r: LogRead) -> None:
    name = hit[1]
    if name.upper() in ("KV", "MOE") or "MoE" in r.line:  # a KV-cache or MoE "backend"
        return
    r.facts.attention_backend = name
    r.facts.mla = "MLA" in name.upper() or r.facts.mla
    r.quote("attention")


def _linear_kernel(hit: re.Match[str], r: LogRead) -> None:
    r.facts.linear_kernel = f"{hit[2]} -> {hit[1]}"
    r.facts.quant_scheme = r.facts.quant_scheme or hit[2]


def _moe_backend(hit: re.Match[str], r: LogRead) -> None:
    r.facts.moe_backend = (hit[1] or hit[2] or "").replace("'", "").strip()


def _custom_allreduce(hit: re.Match[str], r: LogRead) -> None:
    r.facts.custom_allreduce_disabled = True
    r.facts.custom_allreduce_reason = hit[1].strip().rstrip(".")


def _model_load(hit: re.Match[str], r: LogRead) -> None:
    r.facts.model_memory_gib = num(hit[1])
    r.facts.model_load_s = num(hit[2])


def _max_concurrency(hit: re.Match[str], r: LogRead) -> None:
    r.facts.max_concurrency_tokens_per_request = _int(hit[1])
    r.facts.max_concurrency = num(hit[2])


def _graphs(hit: re.Match[str], r: LogRead) -> None:
    r.facts.graph_capture_s = num(hit[1])
    if hit[2]:
        r.facts.graph_capture_gib = num(hit[2])


_PROGRESS = re.compile(r"(\d+)/(\d+) \[((?:\d+:)?\d+:\d+)<((?:\d+:)?\d+:\d+)")


def _clock_s(text: str) -> float:
    """tqdm's ``mm:ss`` or ``h:mm:ss`` as seconds."""
    total = 0.0
    for part in text.split(":"):
        total = total * 60 + float(part)
    return total


def _warmup(hit: re.Match[str], r: LogRead) -> None:
    # tqdm rewrites its bar with \r: one log line holds every update, the last is the latest
    bars = _PROGRESS.findall(r.line)
    if not bars:
        return
    done, total, elapsed, left = bars[-1]
    r.facts.warmup = hit[1] + " warm-up"
    r.facts.warmup_shapes, r.facts.warmup_done = int(total), int(done)
    r.facts.warmup_eta_s = _clock_s(elapsed) + _clock_s(left)
    r.quote("warmup", r.line.split("\r")[-1][-200:])
    r.facts.evidence["warmup"] = r.facts.evidence["warmup"][-1:]  # the latest update only


def _compile_hit(hit: re.Match[str], r: LogRead) -> None:
    if r.facts.compile_cache_hit is None:  # a miss anywhere wins
        r.facts.compile_cache_hit = True


def _init(hit: re.Match[str], r: LogRead) -> None:
    r.facts.init_engine_s = num(hit[1])
    comp = re.search(r"\(compilation: " + NUM + " s", r.line)  # vLLM >= 0.2x
    if comp and r.facts.torch_compile_s is None:
        r.facts.torch_compile_s = num(comp.group(1))


def _partial_cudagraphs(hit: re.Match[str], r: LogRead) -> None:
    to = re.search(r"setting cudagraph_mode=(\w+)", r.line)
    if to:
        r.facts.cudagraph_downgrade = to.group(1)


def _spec_decode(hit: re.Match[str], r: LogRead) -> None:
    r.facts.spec_mean_acceptance = float(hit[1])
    r.facts.spec_acceptance_rate_pct = None if hit[2] == "nan" else float(hit[2])


# vLLM's speculative methods (SpeculativeConfig.method) in predict's words: every MTP flavour
# (deepseek_mtp, qwen3_next_mtp, glm4_moe_mtp, ernie_mtp, mtp) runs the checkpoint's MTP layers
def _spec_method(method: str) -> str | None:
    m = method.lower()
    if "mtp" in m:
        return "mtp"
    return m if m in ("eagle", "eagle3", "ngram") else None


def _spec_config(hit: re.Match[str], r: LogRead) -> None:
    """``speculative_config=SpeculativeConfig(method='mtp', model=..., num_spec_tokens=2)`` in
    the engine-config line (vLLM ``SpeculativeConfig.__repr__``)."""
    r.facts.spec_method = _spec_method(hit[1])
    r.facts.spec_tokens = int(hit[2])


def _csv(text: str) -> list[str]:
    return [f.strip() for f in text.split(",") if f.strip()]


_RULES = (
    Rule(re.compile(r"version (\d+\.\d+\.\d+\S*)"), apply=_banner_version),
    Rule(re.compile(r"vLLM API server version (\S+)"), field="version", first_only=True),
    Rule(
        re.compile(r"Initializing a (V1 )?LLM engine \(v?([^)]+)\) with config: (.*)$"),
        apply=_engine_config,
    ),
    Rule(
        re.compile(r"SpeculativeConfig\(method='(\w+)', model=[^,]*, num_spec_tokens=(\d+)\)"),
        apply=_spec_config,
        evidence="spec_decode",
    ),
    Rule(re.compile(r"non-default args: (\{.*\})\s*$"), apply=_non_default),
    # vllm/model_executor/warmup/deep_gemm_warmup.py (tqdm "DeepGEMM warmup"), 0.25
    Rule(re.compile(r"(DeepGEMM) warmup:"), apply=_warmup),
    Rule(re.compile(r"Automatically detected platform (\w+)"), field="device", convert=str.lower),
    Rule(re.compile(r"Resolved architecture: (\S+)"), field="architecture"),
    Rule(re.compile(r"Using max model len (\d+)"), field="max_model_len", convert=int),
    Rule(
        re.compile(
            r"Using (?:AttentionBackendEnum\.|_Backend\.)?([A-Z][A-Za-z0-9_]*(?: [A-Z][A-Za-z0-9_]*)*)"
            r" (?:attention )?backend(?: on V1 engine)?(?: out of potential backends.*)?\.?\s*$"
        ),
        apply=_attention,
    ),
    Rule(
        re.compile(r"(?:Using|Selected) (\w+Kernel) for ([\w-]+)(?: (?:GEMM|linear))?"),
        apply=_linear_kernel,
        evidence="linear_kernel",
    ),
    Rule(
        re.compile(r"does not have native support for (FP4|FP8) computation"),
        field="weight_only_fallback",
        evidence="weight_only_fallback",
    ),
    Rule(
        re.compile(
            r"AllReduce fusion pass is disabled\.|Flashinfer allreduce fusion is not supported"
            r"|Flashinfer is not installed or comm module not found, skipping allreduce fusion"
        ),
        evidence="allreduce_fusion_off",
    ),
    Rule(
        re.compile(r"NVFP4 linear falling back to the slow and unoptimized emulation"),
        evidence="quant_emulation",
    ),
    Rule(
        re.compile(
            r"SpecDecoding metrics: Mean acceptance length: ([\d.]+).*?"
            r"Avg Draft acceptance rate: ([\d.]+|nan)%"
        ),
        apply=_spec_decode,
        evidence="spec_decode",
    ),
    Rule(re.compile(r"Using (\w+MoE\w*Method)\b"), field="moe_kernel", evidence="linear_kernel"),
    Rule(
        re.compile(r"Using ([\w' -]+?) (?:MoE backend|backend for MoE)|MoE backend: (\S+)"),
        apply=_moe_backend,
        evidence="moe",
    ),
    Rule(
        re.compile(r"Using default MoE config\. Performance might be sub-optimal"),
        evidence="default_moe_config",
    ),
    Rule(
        re.compile(r"Custom allreduce is disabled(?: because| due to)? (.*?)(?:\. To silence.*)?$"),
        apply=_custom_allreduce,
        evidence="custom_allreduce",
    ),
    Rule(
        re.compile(r"vLLM is using nccl==(\S+)|NCCL version (\d+\.\d+\.\d+)"), field="nccl_version"
    ),
    Rule(
        re.compile(r"Loading weights took " + NUM + r" s"),
        field="weights_load_s",
        convert=num,
        evidence="load",
    ),
    Rule(
        re.compile(r"Model loading took " + NUM + r" ?GiB(?: memory)? and " + NUM + r" s"),
        apply=_model_load,
        evidence="load",
    ),
    Rule(
        re.compile(r"(?:GPU|CPU|XPU|TPU)? ?KV cache size: " + NUM + r" tokens"),
        field="kv_cache_tokens",
        convert=_int,
        evidence="kv",
    ),
    Rule(
        re.compile(r"Maximum concurrency for " + NUM + r" tokens per request: " + NUM + r"x"),
        apply=_max_concurrency,
        evidence="kv",
    ),
    Rule(
        re.compile(
            r"Available KV cache memory: "
            + NUM
            + r" GiB|(?:set|Explicitly set) \(?"
            + NUM
            + r"(?:/[\d.]+\)?)? GiB for KV cache"
        ),
        field="kv_cache_memory_gib",
        convert=num,
        evidence="kv",
    ),
    Rule(
        re.compile(r"Graph capturing finished in " + NUM + r" secs?(?:, took " + NUM + r" GiB)?"),
        apply=_graphs,
        evidence="graphs",
    ),
    Rule(
        re.compile(r"torch\.compile t(?:akes|ook) " + NUM + r" s in total"),
        field="torch_compile_s",
        convert=num,
        evidence="compile_cache",
    ),
    Rule(
        re.compile(
            r"Directly load (?:the compiled graph|AOT compil)|loaded? (?:the )?compiled (?:graph|function).* from (?:the )?cache|Loaded AOT compiled"
        ),
        apply=_compile_hit,
        evidence="compile_cache",
    ),
    Rule(
        re.compile(
            r"Compiling a graph for|Compiling model again due to a load failure|saved AOT compiled function|Cache the graph .* for later use"
        ),
        field="compile_cache_hit",
        value=False,
        evidence="compile_cache",
    ),
    Rule(
        re.compile(r"init engine \(profile, create kv cache, warmup model\) took " + NUM + r" s"),
        apply=_init,
        evidence="init",
    ),
    Rule(re.compile(r"Enabled custom fusions: (.*)$"), field="enabled_fusions", convert=_csv),
    Rule(
        re.compile(r"Enforce eager set|enforce_eager=True|CUDA graph is not supported.*eager"),
        evidence="eager",
    ),
    Rule(
        re.compile(
            r"is not supported with .*(?:PIECEWISE|piecewise)|Truncating max_cudagraph_capture_size|falling back to PIECEWISE|downgrad\w* .*cudagraph",
            re.I,
        ),
        apply=_partial_cudagraphs,
        evidence="partial_cudagraphs",
    ),
    Rule(
        re.compile(
            r"(?:fp8|FP8)[\w ]*(?:kv|KV)[- ]?cache[^.]*(?:not supported|unsupported|is not available)|does not support (?:the )?(?:fp8|FP8)[\w ]*(?:kv|KV)",
            re.I,
        ),
        evidence="fp8_kv_unavailable",
    ),
    Rule(re.compile(r"Unknown vLLM environment variable detected: (\S+)"), evidence="unknown_env"),
    Rule(re.compile(r"Application startup complete"), field="ready", value=True),
)

# CompilationMode (vllm/config/compilation.py) in plain words. The CPU build turns the default
# VLLM_COMPILE into DYNAMO_TRACE_ONCE with backend "inductor" (platforms/cpu.py
# check_and_update_config; "eager" under VLLM_CPU_CI_ENV): Dynamo traces once and Inductor
# compiles the whole graph. vLLM then warns "Inductor compilation was disabled by user settings"
# (config/vllm.py: any mode but VLLM_COMPILE): that is its own pass pipeline, not torch.compile.
_MODE_WORDS = {
    "NONE": "eager: no torch.compile",
    "STOCK_TORCH_COMPILE": "torch.compile (PyTorch's standard pipeline)",
    "DYNAMO_TRACE_ONCE": "torch.compile: Dynamo traces the model once",
    "VLLM_COMPILE": "torch.compile: vLLM's piecewise Inductor pipeline with its fusion passes",
}
_BACKEND_WORDS = {
    "inductor": "Inductor compiles the graph",
    "eager": "the traced graph runs op by op (backend eager: no Inductor)",
}


def _describe_compilation(r: LogRead) -> None:
    f = r.facts
    if f.enforce_eager:
        f.compilation = "eager: torch.compile off (enforce_eager)"
        return
    if f.compilation_mode is None:
        return
    words = _MODE_WORDS.get(f.compilation_mode, f"compilation mode {f.compilation_mode}")
    if f.compilation_mode in ("STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE") and f.compile_backend:
        words += ", " + _BACKEND_WORDS.get(f.compile_backend, f"backend {f.compile_backend}")
    if f.compilation_mode != "NONE" and f.compile_cache_hit is not None:
        words += (
            "; loaded from the compile cache"
            if f.compile_cache_hit
            else "; compiled at start-up (no usable cache)"
        )
    f.compilation = words


#: vLLM's start-up log: levelled lines (ERROR/CRITICAL, WARNING), tracebacks' last lines as
#: errors, start-up time from the first timestamp to "Application startup complete"
VLLM_LOG = LogGrammar(
    rules=_RULES,
    line=_LINE,
    levels={"WARNING": "warning", "ERROR": "error", "CRITICAL": "error"},
    error=re.compile(r"^\w*(Error|Exception): "),
    timestamp=_seconds,
    day_clock=True,
    finish=_describe_compilation,
)


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
    backend = cc.get("backend")
    if isinstance(backend, str) and backend:
        facts.compile_backend = backend
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
