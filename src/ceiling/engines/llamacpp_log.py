"""llama.cpp's start-up log grammars (``ceiling inspect``), as data: ``LLAMACPP_LOG`` for
llama-cpp-python's server (llama.cpp's own loader lines, then uvicorn's) and ``LLAMA_SERVER_LOG``
for the ``llama-server`` binary (the same loader lines behind a time/level prefix, then the
server's own). Pure data and the small functions that read a line: no I/O, so that
``ceiling.diagnose`` reads them (through ``diagnosis_data.py``) without the adapters
(``llamacpp.py``, ``llamacpp_server.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ceiling.engines.logparse import Apply, LogGrammar, LogRead, Rule, num

# llama.cpp's ``file type`` names (llama_ftype_name) that are plain floating-point types
_FLOAT_FILE_TYPES = {
    "all F32": "float32",
    "F16": "float16",
    "MOSTLY_F16": "float16",
    "BF16": "bfloat16",
}
_MIB = 1024.0


def _file_type(hit: re.Match[str], r: LogRead) -> None:
    if hit[1] in _FLOAT_FILE_TYPES:
        r.facts.dtype = _FLOAT_FILE_TYPES[hit[1]]
    else:
        r.facts.quantization, r.facts.quant_scheme = "gguf", hit[1]


def _device(hit: re.Match[str], r: LogRead) -> None:
    r.scratch.setdefault("devices", []).append(hit[1])


def _offloaded(hit: re.Match[str], r: LogRead) -> None:
    if int(hit[1]) > 0:
        r.scratch.setdefault("devices", []).append("GPU")
    r.facts.gpu_layers, r.facts.gpu_layers_total = int(hit[1]), int(hit[2])


def _model_buffer(hit: re.Match[str], r: LogRead) -> None:
    r.scratch["model_mib"] = r.scratch.get("model_mib", 0.0) + num(hit[2])
    r.scratch.setdefault("buffers", []).append(hit[1])


def _ctx_per_sequence(hit: re.Match[str], r: LogRead) -> None:
    r.facts.max_model_len = int(hit[1])  # what one request can use
    r.facts.max_concurrency_tokens_per_request = int(hit[1])


def _flash_attn(hit: re.Match[str], r: LogRead) -> None:
    r.facts.attention_backend = f"llama.cpp (flash_attn {hit[1]})"
    # ``enabled``/``disabled`` once resolved (``auto`` is resolved per device at start-up)
    r.facts.flash_attention = {"enabled": True, "disabled": False}.get(hit[1])


def _kv_size(hit: re.Match[str], r: LogRead) -> None:
    """``size = 0.50 MiB (512 cells, 2 layers, 4/1 seqs), K (f16): ...``: the cells are per
    stream (src/llama-kv-cache.cpp: K/V tensors of kv_size x n_stream; one stream when
    unified, one per sequence when not), so the cache holds cells x streams tokens."""
    r.facts.kv_cache_memory_gib = num(hit[1]) / _MIB
    r.facts.kv_cache_tokens = int(hit[2]) * int(hit[3] or 1)
    r.facts.kv_cache_dtype = hit[4]


def device_of(names: list[str]) -> str:
    """``cpu``, or the first GPU backend's name without its index (``CUDA0`` -> ``cuda``)."""
    gpu = [d for d in names if not d.upper().startswith("CPU")]
    return re.sub(r"\d+$", "", gpu[0]).lower() if gpu else "cpu"


def finish_loader(r: LogRead) -> None:
    if r.scratch.get("devices"):
        r.facts.device = device_of(r.scratch["devices"])
    if r.scratch.get("model_mib"):
        r.facts.model_memory_gib = r.scratch["model_mib"] / _MIB


def _rule(
    name: str,
    pattern: str,
    field: str | None = None,
    convert: Callable[[str], Any] = str,
    value: Any = None,
    first_only: bool = False,
    apply: Apply | None = None,
) -> Rule:
    """A llama.cpp loader line, quoted under its own name."""
    return Rule(re.compile(pattern), field, convert, value, first_only, apply, evidence=name)


#: llama.cpp's loader lines (llama_model_loader:, print_info:, load_tensors:, llama_context:,
#: llama_kv_cache:) as both flavours print them, and uvicorn's ready line
LLAMACPP_RULES = (
    _rule(
        "model",
        r"^llama_model_loader: loaded meta data with .* from (.+?) \(version ",
        field="model",
    ),
    _rule("architecture", r"^print_info: arch\s+= (\S+)", field="architecture"),
    _rule("file_type", r"^print_info: file type\s+= (.+?)\s*$", apply=_file_type),
    _rule("device", r"^load_tensors: layer\s+\d+ assigned to device (\S+?),", apply=_device),
    _rule("offloaded", r"^load_tensors: offloaded (\d+)/(\d+) layers to GPU", apply=_offloaded),
    _rule(
        "model_buffer",
        r"^load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB",
        apply=_model_buffer,
    ),
    _rule(
        "n_seq_max", r"^llama_context: n_seq_max\s+= (\d+)", field="max_concurrency", convert=float
    ),
    _rule(
        "n_ctx",
        r"^llama_context: n_ctx\s+= (\d+)",
        field="max_model_len",
        convert=int,
        first_only=True,
    ),
    _rule("n_ctx_seq", r"^llama_context: n_ctx_(?:seq|per_seq)\s+= (\d+)", apply=_ctx_per_sequence),
    _rule("flash_attn", r"^llama_context: flash_attn\s+= (\S+)", apply=_flash_attn),
    _rule(
        "kv_size",
        r"^llama_kv_cache(?:_unified)?: size =\s+([\d.]+) MiB \(\s*(\d+) cells,"
        r"(?:\s*\d+ layers,\s*\d+/(\d+) seqs)?.*?K \((\w+)\)",
        apply=_kv_size,
    ),
    _rule(
        "kv_unified",
        r"^llama_context: kv_unified\s+= (\w+)",
        field="kv_unified",
        convert=lambda v: v == "true",
    ),
    _rule("ready", r"Application startup complete", field="ready", value=True),
)

#: llama-cpp-python's log: llama.cpp's loader lines (no timestamps, no levels), then its own
#: ``Model metadata:`` / chat-template lines, then uvicorn's
LLAMACPP_LOG = LogGrammar(
    rules=LLAMACPP_RULES,
    strip=True,
    error=re.compile(
        r"^ERROR:|^\w*(Error|Exception): |\berror (loading|while)|failed to load", re.IGNORECASE
    ),
    warning=re.compile(r"^WARNING:|\bwarning\b|\bWARN\b", re.IGNORECASE),
    finish=finish_loader,
)


def _slots(hit: re.Match[str], r: LogRead) -> None:
    unified = None if hit[3] is None else hit[3] == "true"
    r.scratch["slots"] = (int(hit[1]), int(hit[2]), unified)  # applied last: the server's word


def _graphs_built(hit: re.Match[str], r: LogRead) -> None:
    """``system_info: ... CUDA : ARCHS = 900 | USE_GRAPHS = 1``: the build captures CUDA graphs
    (unless the variant's environment turned them off: that line comes first)."""
    if r.facts.cudagraph_mode is None:
        on = hit[1] == "1"
        r.facts.cudagraph_mode, r.facts.enforce_eager = ("llama.cpp" if on else "NONE"), not on


def _graphs_env(hit: re.Match[str], r: LogRead) -> None:
    """ggml-cuda reads GGML_CUDA_DISABLE_GRAPHS once (common.cuh: set at all = off) and logs
    nothing about it: the doctor passes the variant's value in as a line of its own."""
    r.facts.cudagraph_mode, r.facts.enforce_eager = "NONE", True


def _build(hit: re.Match[str], r: LogRead) -> None:
    r.facts.version = f"b{hit[1]}.{hit[2]}"


def _finish(r: LogRead) -> None:
    """llama.cpp's facts, then the weight buffers' device (no per-layer device lines at -lv 4),
    then the slots: parallel sequences, each allowed ``n_ctx_slot`` tokens (llama_n_ctx_seq).

    With ``kv_unified`` the slots share ONE pool of n_ctx cells and n_ctx_slot is that whole
    n_ctx: the cache holds n_ctx / n_ctx_slot full-length requests, whatever the slot count.
    Without it each slot has its own n_ctx / n_parallel cells (src/llama-context.cpp
    ``n_ctx_seq``; tools/server/server-context.cpp logs both; builds that do not print
    ``kv_unified`` predate it and split the context)."""
    finish_loader(r)
    buffers = r.scratch.get("buffers") or []
    # the weight buffers name the backend (``CUDA0 model buffer``); the offload line only says
    # that some layers are on "a GPU"
    if buffers and (r.facts.device is None or r.facts.device == "gpu"):
        r.facts.device = device_of(buffers)
    if "slots" in r.scratch:
        n_slots, n_ctx_slot, unified = r.scratch["slots"]
        if unified is not None:
            r.facts.kv_unified = unified
        shared = bool(r.facts.kv_unified)
        cells = r.facts.kv_cache_tokens or (n_ctx_slot if shared else n_slots * n_ctx_slot)
        r.facts.kv_cache_tokens = cells
        r.facts.max_concurrency = cells / n_ctx_slot if n_ctx_slot else float(n_slots)
        r.facts.max_model_len = n_ctx_slot
        r.facts.max_concurrency_tokens_per_request = n_ctx_slot
        # the slots are the running-sequence cap too (``--parallel``): concurrency-cap reads it
        r.facts.non_default_args["n_slots"] = n_slots


#: llama-server's log: every line is ``0.00.015.125 I `` (time since start, level) and then a
#: message; llama.cpp's loader lines then read as in llama-cpp-python's log, and the server's
#: own (``srv  load_model: ...``, ``main: model loaded``, ``... listening on http://...``) follow
LLAMA_SERVER_LOG = replace(
    LLAMACPP_LOG,
    prefix=re.compile(r"^\d+\.\d+\.\d+\.\d+ [IWEDT] "),
    rules=(
        *LLAMACPP_RULES,
        Rule(
            re.compile(
                r"load_model: initializing, n_slots = (\d+), n_ctx_slot = (\d+)"
                r"(?:, kv_unified = '(\w+)')?"
            ),
            apply=_slots,
            evidence="n_slots",
        ),
        Rule(
            re.compile(r"llama_server: listening on (\S+)"),
            field="ready",
            value=True,
            evidence="listening",
        ),
        Rule(
            re.compile(r"system_info: .*\bCUDA : .*?USE_GRAPHS = (\d)"),
            apply=_graphs_built,
            evidence="eager",
        ),
        Rule(
            re.compile(r"^ceiling: variant env GGML_CUDA_DISABLE_GRAPHS=(.*)$"),
            apply=_graphs_env,
            evidence="eager",
        ),
        Rule(
            re.compile(r"common_params_print_info: build (\d+) \((\w+)\)"),
            apply=_build,
            evidence="build",
        ),
    ),
    finish=_finish,
)
