"""Engine start-up logs -> EngineFacts (what the engine actually did) + findings.

Grepping a start-up log for ``custom_ops``, ``fuse_norm_quant``, CUDA-graph and AOT-cache lines is
what the founding story did by hand. This module reads the log formats of vLLM 0.10 to current
(lines with or without a ``(APIServer pid=N)`` / ``(EngineCore_DP0 pid=N)`` prefix, ANSI colour,
compilation config printed as JSON in older releases and as a Python repr in newer ones) and of
SGLang (``[date time TP0] message`` lines, ``server_args=ServerArgs(...)``).

Each fact keeps the log lines it came from in ``evidence`` so that findings can quote them.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ceiling.diagnose.findings import Finding, derive_findings
from ceiling.errors import CeilingError

SCHEMA_VERSION = 1
MAX_MESSAGES = 40

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_VLLM_LINE = re.compile(
    r"^(?:\((?P<proc>[^)]*?)\s*pid=(?P<pid>\d+)\)\s+)?"
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d\s+[\d:.]+\s+"
    r"\[(?P<src>[^\]]+)\]\s?(?P<msg>.*)$"
)
_SGLANG_LINE = re.compile(
    r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?: (?P<rank>[^\]]+))?\] (?P<msg>.*)$"
)
_NUM = r"([\d,]+(?:\.\d+)?)"


class EngineFacts(BaseModel):
    """What an engine's start-up log says about the deployment (None: the log does not say)."""

    schema_version: int = SCHEMA_VERSION
    source: str | None = None
    engine: str | None = None
    version: str | None = None
    v1: bool | None = None
    device: str | None = None
    model: str | None = None
    served_model_name: str | None = None
    architecture: str | None = None
    non_default_args: dict[str, Any] = Field(default_factory=dict)
    dtype: str | None = None
    max_model_len: int | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    data_parallel_size: int | None = None
    expert_parallel: bool | None = None
    expert_parallel_size: int | None = None
    decode_context_parallel_size: int | None = None
    quantization: str | None = None
    quant_scheme: str | None = None
    linear_kernel: str | None = None
    moe_kernel: str | None = None
    moe_backend: str | None = None
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None
    mla: bool | None = None
    enforce_eager: bool | None = None
    compilation_mode: str | None = None
    cudagraph_mode: str | None = None
    cudagraph_capture_sizes: list[int] | None = None
    max_cudagraph_capture_size: int | None = None
    custom_ops: list[str] | None = None
    fusion_passes: dict[str, bool] | None = None
    enabled_fusions: list[str] | None = None
    compile_cache_hit: bool | None = None
    torch_compile_s: float | None = None
    custom_allreduce_disabled: bool | None = None
    custom_allreduce_reason: str | None = None
    nccl_version: str | None = None
    weights_load_s: float | None = None
    model_load_s: float | None = None
    model_memory_gib: float | None = None
    kv_cache_memory_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens_per_request: int | None = None
    graph_capture_s: float | None = None
    graph_capture_gib: float | None = None
    init_engine_s: float | None = None
    startup_s: float | None = None
    ready: bool = False
    warnings: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    # per-fact source lines, for findings to quote (kept out of JSON: findings carry their own)
    evidence: dict[str, list[str]] = Field(default_factory=dict, exclude=True)
    findings: list[Finding] = Field(default_factory=list)

    def add_evidence(self, key: str, line: str) -> None:
        lines = self.evidence.setdefault(key, [])
        if line not in lines and len(lines) < 6:
            lines.append(line)


# ---- small parsers ----------------------------------------------------------------------


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets and quotes (for ``k=v, k2=Config(a=1, b=[2, 3])``)."""
    parts, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if cur:
        parts.append("".join(cur).strip())
    return parts


def _kv_pairs(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in _split_top(text):
        key, eq, value = part.partition("=")
        if eq and re.fullmatch(r"[A-Za-z_][\w.]*", key.strip()):
            out[key.strip()] = value.strip()
    return out


def _balanced(text: str, start: int) -> str:
    """The bracketed expression that opens at ``text[start]``."""
    open_ch = text[start]
    close_ch = {"{": "}", "(": ")", "[": "]"}[open_ch]
    depth, quote = 0, ""
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch == open_ch:
            depth += 1
        elif ch == close_ch:
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return text[start:]


_ENUM_REPR = re.compile(r"<(\w+)\.(\w+): [^>]*>")


def parse_config_repr(text: str) -> Any:
    """A config printed as JSON (vLLM <= 0.10) or as a Python repr with enums (>= 0.11)."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    cleaned = _ENUM_REPR.sub(lambda m: repr(m.group(2)), text)
    cleaned = re.sub(
        r"(?<![\w.'\"])([A-Za-z_]\w*)\.([A-Za-z_]\w*)(?=[,}\]])",
        lambda m: repr(m.group(2)),
        cleaned,
    )
    try:
        return ast.literal_eval(cleaned)
    except (ValueError, SyntaxError):
        return None


def _unquote(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _as_int(value: str | None) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _as_bool(value: str | None) -> bool | None:
    if value is None:
        return None
    return {"True": True, "False": False, "true": True, "false": False}.get(value.strip())


# ---- vLLM --------------------------------------------------------------------------------

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
    ("linear_kernel", re.compile(r"Using (\w+Kernel) for (\w+)")),
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
    ("weights", re.compile(r"Loading weights took " + _NUM + r" s")),
    (
        "model_load",
        re.compile(r"Model loading took " + _NUM + r" ?GiB(?: memory)? and " + _NUM + r" s"),
    ),
    ("kv_tokens", re.compile(r"(?:GPU|CPU|XPU|TPU)? ?KV cache size: " + _NUM + r" tokens")),
    (
        "max_conc",
        re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: " + _NUM + r"x"),
    ),
    (
        "kv_mem",
        re.compile(
            r"Available KV cache memory: "
            + _NUM
            + r" GiB|(?:set|Explicitly set) \(?"
            + _NUM
            + r"(?:/[\d.]+\)?)? GiB for KV cache"
        ),
    ),
    (
        "graph",
        re.compile(r"Graph capturing finished in " + _NUM + r" secs?(?:, took " + _NUM + r" GiB)?"),
    ),
    ("compile_total", re.compile(r"torch\.compile takes " + _NUM + r" s in total")),
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
        re.compile(r"init engine \(profile, create kv cache, warmup model\) took " + _NUM + r" s"),
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
        facts.weights_load_s = _num(g[0])
        facts.add_evidence("load", line)
    elif key == "model_load":
        facts.model_memory_gib = _num(g[0])
        facts.model_load_s = _num(g[1])
        facts.add_evidence("load", line)
    elif key == "kv_tokens":
        facts.kv_cache_tokens = int(_num(g[0]))
        facts.add_evidence("kv", line)
    elif key == "max_conc":
        facts.max_concurrency_tokens_per_request = int(_num(g[0]))
        facts.max_concurrency = _num(g[1])
        facts.add_evidence("kv", line)
    elif key == "kv_mem":
        facts.kv_cache_memory_gib = _num(g[0] or g[1])
        facts.add_evidence("kv", line)
    elif key == "graph":
        facts.graph_capture_s = _num(g[0])
        if g[1]:
            facts.graph_capture_gib = _num(g[1])
        facts.add_evidence("graphs", line)
    elif key == "compile_total":
        facts.torch_compile_s = _num(g[0])
        facts.add_evidence("compile_cache", line)
    elif key == "compile_hit":
        if facts.compile_cache_hit is None:
            facts.compile_cache_hit = True
        facts.add_evidence("compile_cache", line)
    elif key == "compile_miss":
        facts.compile_cache_hit = False
        facts.add_evidence("compile_cache", line)
    elif key == "init":
        facts.init_engine_s = _num(g[0])
        comp = re.search(r"\(compilation: " + _NUM + " s", line)  # vLLM >= 0.2x
        if comp and facts.torch_compile_s is None:
            facts.torch_compile_s = _num(comp.group(1))
        facts.add_evidence("init", line)
    elif key == "fusions":
        facts.enabled_fusions = [f.strip() for f in g[0].split(",") if f.strip()]
    elif key == "eager":
        facts.add_evidence("eager", line)
    elif key == "partial_cg":
        facts.add_evidence("partial_cudagraphs", line)
    elif key == "fp8_kv":
        facts.add_evidence("fp8_kv_unavailable", line)
    elif key == "unknown_env":
        facts.add_evidence("unknown_env", line)
    elif key == "ready":
        facts.ready = True


def _apply_engine_config(text: str, line: str, facts: EngineFacts) -> None:
    """``model='...', tensor_parallel_size=8, ..., compilation_config={...}`` (V1 config line)."""
    kv = _kv_pairs(text)
    facts.model = facts.model or _unquote(kv.get("model"))
    facts.served_model_name = _unquote(kv.get("served_model_name")) or facts.served_model_name
    facts.dtype = (kv.get("dtype") or "").replace("torch.", "") or facts.dtype
    facts.max_model_len = _as_int(kv.get("max_seq_len")) or facts.max_model_len
    facts.tensor_parallel_size = _as_int(kv.get("tensor_parallel_size"))
    facts.pipeline_parallel_size = _as_int(kv.get("pipeline_parallel_size"))
    facts.data_parallel_size = _as_int(kv.get("data_parallel_size"))
    facts.decode_context_parallel_size = _as_int(kv.get("decode_context_parallel_size"))
    quant = _unquote(kv.get("quantization"))
    facts.quantization = None if quant in (None, "None") else quant
    kvd = _unquote(kv.get("kv_cache_dtype"))
    facts.kv_cache_dtype = kvd
    facts.device = _unquote(kv.get("device_config")) or facts.device
    ar = _as_bool(kv.get("disable_custom_all_reduce"))
    if ar and facts.custom_allreduce_disabled is None:
        facts.custom_allreduce_disabled = True
        facts.custom_allreduce_reason = "disable_custom_all_reduce=True in the engine config"
        facts.add_evidence("custom_allreduce", _shorten(line, "disable_custom_all_reduce=True"))
    if _as_bool(kv.get("enable_expert_parallel")):
        facts.expert_parallel = True
    eager = _as_bool(kv.get("enforce_eager"))
    if eager is not None:
        facts.enforce_eager = eager
        if eager:
            facts.add_evidence("eager", _shorten(line, "enforce_eager=True"))
    cc_start = text.find("compilation_config=")
    if cc_start >= 0:
        brace = text.find("{", cc_start)
        if brace >= 0:
            cc = parse_config_repr(_balanced(text, brace))
            if isinstance(cc, dict):
                _apply_compilation(cc, facts)
                facts.add_evidence("compilation", _shorten(line, "compilation_config="))


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


def _shorten(line: str, needle: str, width: int = 160) -> str:
    """The part of a very long config line around ``needle`` (evidence stays readable)."""
    if len(line) <= width * 2:
        return line
    idx = line.find(needle)
    if idx < 0:
        return line[:width] + " ..."
    start = max(0, idx - 40)
    return ("... " if start else "") + line[start : idx + width] + " ..."


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


def _literal(value: str) -> Any:
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


# ---- SGLang ------------------------------------------------------------------------------

_S_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("server_args", re.compile(r"server_args=ServerArgs\((.*)\)\s*$")),
    ("version", re.compile(r"sglang(?: version)?[=: ]+v?(\d+\.\d+\.\d+\S*)", re.I)),
    (
        "weights_end",
        re.compile(r"Load weight end\. .*?mem usage=" + _NUM + r" GB"),
    ),
    (
        "weights_time",
        re.compile(r"Load weight end\. elapsed=" + _NUM + r" s|Loading weights took " + _NUM),
    ),
    (
        "kv_alloc",
        re.compile(r"KV Cache is allocated\. #tokens: " + _NUM),
    ),
    (
        "max_tokens",
        re.compile(
            r"max_total_num_tokens="
            + _NUM
            + r".*?max_running_requests="
            + _NUM
            + r"(?:.*?context_len="
            + _NUM
            + ")?"
        ),
    ),
    (
        "graph_end",
        re.compile(
            r"Capture cuda graph end\. Time elapsed: " + _NUM + r" s\. mem usage=" + _NUM + r" GB"
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
        kv = _kv_pairs(g[0])
        facts.model = _unquote(kv.get("model_path"))
        facts.served_model_name = _unquote(kv.get("served_model_name"))
        facts.tensor_parallel_size = _as_int(kv.get("tp_size"))
        facts.pipeline_parallel_size = _as_int(kv.get("pp_size"))
        facts.data_parallel_size = _as_int(kv.get("dp_size"))
        facts.expert_parallel_size = _as_int(kv.get("ep_size"))
        facts.expert_parallel = (facts.expert_parallel_size or 1) > 1 or None
        q = _unquote(kv.get("quantization"))
        facts.quantization = None if q in (None, "None") else q
        facts.kv_cache_dtype = _unquote(kv.get("kv_cache_dtype"))
        facts.dtype = _unquote(kv.get("dtype"))
        facts.max_model_len = _as_int(kv.get("context_length")) or facts.max_model_len
        ab = _unquote(kv.get("attention_backend"))
        if ab and ab != "None":
            facts.attention_backend = ab
        moe = _unquote(kv.get("moe_runner_backend"))
        if moe and moe != "None":
            facts.moe_backend = moe
        disable_cg = _as_bool(kv.get("disable_cuda_graph"))
        if disable_cg is not None:
            facts.enforce_eager = disable_cg
            facts.cudagraph_mode = "NONE" if disable_cg else "FULL"
            if disable_cg:
                facts.add_evidence("eager", _shorten(line, "disable_cuda_graph=True"))
        if _as_bool(kv.get("disable_custom_all_reduce")):
            facts.custom_allreduce_disabled = True
            facts.custom_allreduce_reason = "disable_custom_all_reduce=True in server_args"
            facts.add_evidence("custom_allreduce", _shorten(line, "disable_custom_all_reduce"))
        facts.device = _unquote(kv.get("device")) or facts.device
        # SGLang prints every field; keep the ones that shape performance, as Python values.
        facts.non_default_args = {k: _literal(v) for k, v in kv.items() if k in _SGLANG_KEY_ARGS}
    elif key == "version":
        facts.version = facts.version or g[0]
    elif key == "weights_end":
        facts.model_memory_gib = _num(g[0])  # SGLang's "GB" are GiB (bytes / 2**30)
        arch = re.search(r"type=(\w+)", line)
        facts.architecture = arch.group(1) if arch else facts.architecture
        facts.add_evidence("load", line)
    elif key == "weights_time":
        facts.weights_load_s = _num(g[0] or g[1])
        facts.add_evidence("load", line)
    elif key == "kv_alloc":
        # "#tokens: N, KV size: X GB" (MLA) or "#tokens: N, K size: X GB, V size: Y GB"
        facts.kv_cache_tokens = int(_num(g[0]))
        sizes = re.findall(r"\b(?:KV|K|V) size: " + _NUM + " GB", line)
        if sizes:
            facts.kv_cache_memory_gib = round(sum(_num(x) for x in sizes), 2)
        facts.add_evidence("kv", line)
    elif key == "max_tokens":
        facts.kv_cache_tokens = int(_num(g[0]))
        if g[2]:
            ctx = int(_num(g[2]))
            facts.max_model_len = facts.max_model_len or ctx
            facts.max_concurrency_tokens_per_request = ctx
            facts.max_concurrency = round(_num(g[0]) / ctx, 2)
        facts.add_evidence("kv", line)
    elif key == "graph_end":
        facts.graph_capture_s = _num(g[0])
        facts.graph_capture_gib = _num(g[1])
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


# ---- entry points ------------------------------------------------------------------------


def detect_engine(lines: list[str]) -> str | None:
    """``vllm`` / ``sglang`` from the log's own markers (None when neither is recognisable)."""
    head = "\n".join(lines[:400])
    if re.search(r"server_args=ServerArgs|sglang|The server is fired up", head):
        return "sglang"
    if re.search(r"vLLM|vllm|LLM engine \(v|non-default args", head):
        return "vllm"
    return None


def parse_lines(
    lines: list[str], engine: str | None = None, concurrency: int | None = None
) -> EngineFacts:
    """Facts (and findings) from log lines; ANSI colour and carriage-return redraws removed."""
    clean = [_ANSI.sub("", p) for ln in lines for p in ln.rstrip("\n").split("\r")]
    engine = engine or detect_engine(clean)
    facts = EngineFacts(engine=engine)
    if engine == "sglang":
        _parse_sglang(clean, facts)
    elif engine == "vllm":
        _parse_vllm(clean, facts)
    else:
        raise CeilingError(
            "cannot tell which engine wrote this log",
            fix="pass --engine vllm or --engine sglang",
        )
    facts.findings = derive_findings(facts, concurrency=concurrency)
    return facts


def inspect_log(
    path: str | Path, engine: str | None = None, concurrency: int | None = None
) -> EngineFacts:
    """Parse an engine log file into EngineFacts with findings."""
    p = Path(path)
    if not p.is_file():
        raise CeilingError(f"log file not found: {p}", fix="pass the path of an engine log")
    text = p.read_text(encoding="utf-8", errors="replace")
    facts = parse_lines(text.splitlines(), engine=engine, concurrency=concurrency)
    facts.source = str(p)
    return facts


def run_inspect(
    path: Path, engine: str | None = None, concurrency: int | None = None, json_out: bool = False
) -> int:
    """``ceiling inspect``: print the facts and findings."""
    from rich.markup import escape

    from ceiling.console import emit_json, out

    facts = inspect_log(path, engine=engine, concurrency=concurrency)
    if json_out:
        emit_json(facts)
        return 0
    o = out()
    skip = {"findings", "evidence", "warnings", "errors", "non_default_args", "schema_version"}
    for key, value in facts.model_dump().items():
        if key in skip or value in (None, [], {}):
            continue
        o.print(f"{key:>32}: {escape(str(value))}", soft_wrap=True)
    if facts.non_default_args:
        o.print(f"{'non_default_args':>32}: {escape(str(facts.non_default_args))}", soft_wrap=True)
    o.print(f"{'warnings/errors':>32}: {len(facts.warnings)} / {len(facts.errors)}")
    for f in facts.findings:
        colour = {"critical": "red", "warning": "yellow"}.get(f.severity, "cyan")
        o.print(f"[{colour}]{f.severity}[/{colour}] {escape(f.title)} ({f.kind})")
        for line in f.evidence[:3]:
            o.print(f"    | {escape(line)}", soft_wrap=True)
        if f.fix:
            o.print(f"    fix: {escape(f.fix)}", soft_wrap=True)
    return 0
