"""llama.cpp's second flavour, engine ``llamacpp-python``: llama-cpp-python's OpenAI server
(``python -m llama_cpp.server``). The default flavour, engine ``llamacpp``, is the real
``llama-server`` binary (llamacpp_server.py), which shares this module's log grammar for
llama.cpp's own loader lines.

Measured with llama-cpp-python 0.3.36 (scripts/install-llamacpp.sh) serving the tiny GGUF
(src/ceiling/demo/tiny_gguf.py); see docs/engines.md.

- Command: ``python -m llama_cpp.server --model FILE.gguf --model_alias NAME --host H --port P``
  plus the variant's flags (``--n_ctx 512``). The model is one GGUF file.
- Flags: the server's argparse is generated from its pydantic ``Settings``
  (``add_args_from_model(parser, Settings)`` + ``--config_file``, dumped by
  ``data/dump_args.py llamacpp``): every flag is spelled with underscores only (``--n_ctx``;
  ``--n-ctx`` is unknown to it), and booleans take a word (``--verbose false``; the parser is
  ``_parse_bool_arg``, dumped as type ``bool_word``). argparse errors exit 2; values argparse
  accepts but the pydantic settings refuse (``--n_ctx -1``) print "validation error for
  ModelSettings" and exit 1 (``data/death_causes.yaml``: "invalid setting value").
- Readiness: no ``/health`` route; ``/v1/models`` plus uvicorn's "Application startup complete.".
- Start-up log: llama.cpp's own loader lines (``llama_model_loader:``, ``print_info:``,
  ``load_tensors:``, ``llama_context:``, ``llama_kv_cache:``; no timestamps, no levels), then
  llama-cpp-python's ``Model metadata:`` / chat-template lines, then uvicorn's. It says neither
  the package version nor the thread count. ``parse_log`` reads it into EngineFacts.
- Serving: one request at a time (one ``n_seq_max = 1`` context behind a lock), hence
  ``max_concurrency`` 1. Streams carry one token per chunk (with an ASCII vocabulary) and no usage
  chunk (``stream_options.include_usage`` is ignored); there is no ``ignore_eos`` (unknown request
  fields are ignored, not refused): ban the special tokens with ``logit_bias`` to get exactly
  ``max_tokens``, WITHOUT ``min_tokens`` (``ceiling bench --no-ignore-eos --logit-bias ...``):
  given both, 0.3.36 applies neither (``LogitsProcessorList.extend`` returns None), so special
  tokens come out as empty-text chunks and ``</s>`` ends requests early. No Prometheus
  ``/metrics``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ceiling.engines.base import Engine
from ceiling.engines.logparse import MAX_MESSAGES, num

if TYPE_CHECKING:
    from ceiling.diagnose.facts import EngineFacts

_PHASES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"Application startup complete"), "ready"),
    (re.compile(r"Started server process|Waiting for application startup"), "starting API server"),
    (
        re.compile(
            r"^(Model metadata:|Available chat formats|Using gguf chat template|Guessed chat)"
        ),
        "setting up the chat template",
    ),
    (re.compile(r"^(sched_reserve|graph_reserve):"), "reserving compute buffers"),
    (
        re.compile(r"^(llama_kv_cache|llama_context|llama_new_context_with_model):"),
        "allocating KV cache",
    ),
    (re.compile(r"^(load_tensors|llm_load_tensors|create_tensor):"), "loading weights"),
    (re.compile(r"^(llama_model_loader|print_info|load|init_tokenizer):"), "reading the GGUF file"),
]

# llama.cpp's ``file type`` names (llama_ftype_name) that are plain floating-point types
_FLOAT_FILE_TYPES = {
    "all F32": "float32",
    "F16": "float16",
    "MOSTLY_F16": "float16",
    "BF16": "bfloat16",
}
_MIB = 1024.0

_L_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("model", re.compile(r"^llama_model_loader: loaded meta data with .* from (.+?) \(version ")),
    ("architecture", re.compile(r"^print_info: arch\s+= (\S+)")),
    ("file_type", re.compile(r"^print_info: file type\s+= (.+?)\s*$")),
    ("device", re.compile(r"^load_tensors: layer\s+\d+ assigned to device (\S+?),")),
    ("offloaded", re.compile(r"^load_tensors: offloaded (\d+)/(\d+) layers to GPU")),
    ("model_buffer", re.compile(r"^load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")),
    ("n_seq_max", re.compile(r"^llama_context: n_seq_max\s+= (\d+)")),
    ("n_ctx", re.compile(r"^llama_context: n_ctx\s+= (\d+)")),
    ("n_ctx_seq", re.compile(r"^llama_context: n_ctx_(?:seq|per_seq)\s+= (\d+)")),
    ("flash_attn", re.compile(r"^llama_context: flash_attn\s+= (\S+)")),
    (
        "kv_size",
        re.compile(
            r"^llama_kv_cache(?:_unified)?: size =\s+([\d.]+) MiB \(\s*(\d+) cells,"
            r".*?K \((\w+)\)"
        ),
    ),
    ("ready", re.compile(r"Application startup complete")),
]
_WARNING = re.compile(r"^WARNING:|\bwarning\b|\bWARN\b", re.IGNORECASE)
_ERROR = re.compile(
    r"^ERROR:|^\w*(Error|Exception): |\berror (loading|while)|failed to load", re.IGNORECASE
)


class LlamaCppEngine(Engine):
    """llama-cpp-python's server (``llama_cpp.server``)."""

    name = "llamacpp-python"
    display_name = "llama-cpp-python"
    finding_fixes = {  # noqa: RUF012 (class data, read only)
        "kv-capacity": "more context: raise --n_ctx (the server runs one request at a time: "
        "concurrent streams need another server or another engine)",
    }
    ready_line = "Application startup complete."
    health_paths = ("/v1/models",)
    default_port = 8080
    env_prefixes = ()
    dist_names = ("llama_cpp_python",)
    install_dir = "llamacpp"  # beside llama-server (scripts/install-llamacpp.sh)
    server_module = "llama_cpp.server"
    model_flag = "--model"
    served_name_flag = "--model_alias"
    flags_module = "llama_cpp.server"
    dash_underscore_alias = False  # plain argparse over pydantic field names: --n_ctx only
    log_phases = _PHASES
    # llama.cpp's loader prefixes; no other engine's log has them
    log_marker = re.compile(r"^(llama_model_loader|print_info|llama_context|load_tensors): ", re.M)
    log_claim_rank = 50
    # no ``ignore_eos`` (see the module docstring); prompt log-probabilities through ``echo`` +
    # ``logprobs`` need every position's logits kept
    ignore_eos_field = None
    prompt_logprobs_hint = "start the server with --logits_all true to get prompt log-probabilities"

    def install_hint(self) -> str:
        return (
            "install it with `bash scripts/install-llamacpp.sh` (builds llama.cpp once for both "
            "flavours, ~10 min) into .engines/llamacpp, or point `python:` in the variant at an "
            "environment that has `llama-cpp-python[server]`"
        )

    def parse_log(self, lines: list[str], facts: EngineFacts) -> None:
        """llama.cpp's loader lines + llama-cpp-python's + uvicorn's -> facts."""
        devices: list[str] = []
        model_mib = 0.0
        for raw in lines:
            line = raw.strip()
            if not line:
                continue
            if _ERROR.search(line) and len(facts.errors) < MAX_MESSAGES:
                facts.errors.append(line)
            elif (
                _WARNING.search(line)
                and len(facts.warnings) < MAX_MESSAGES
                and line not in facts.warnings
            ):
                facts.warnings.append(line)
            for key, pattern in _L_PATTERNS:
                hit = pattern.search(line)
                if not hit:
                    continue
                g = hit.groups()
                if key == "model":
                    facts.model = g[0]
                elif key == "architecture":
                    facts.architecture = g[0]
                elif key == "file_type":
                    if g[0] in _FLOAT_FILE_TYPES:
                        facts.dtype = _FLOAT_FILE_TYPES[g[0]]
                    else:
                        facts.quantization, facts.quant_scheme = "gguf", g[0]
                elif key == "device":
                    devices.append(g[0])
                elif key == "offloaded" and int(g[0]) > 0:
                    devices.append("GPU")
                elif key == "model_buffer":
                    model_mib += num(g[1])
                elif key == "n_seq_max":
                    facts.max_concurrency = float(g[0])
                elif key == "n_ctx":
                    facts.max_model_len = facts.max_model_len or int(g[0])
                elif key == "n_ctx_seq":
                    facts.max_model_len = int(g[0])  # what one request can use
                    facts.max_concurrency_tokens_per_request = int(g[0])
                elif key == "flash_attn":
                    facts.attention_backend = f"llama.cpp (flash_attn {g[0]})"
                elif key == "kv_size":
                    facts.kv_cache_memory_gib = num(g[0]) / _MIB
                    facts.kv_cache_tokens = int(g[1])
                    facts.kv_cache_dtype = g[2]
                elif key == "ready":
                    facts.ready = True
                facts.add_evidence(key, line)
        if devices:
            gpu = [d for d in devices if not d.upper().startswith("CPU")]
            facts.device = re.sub(r"\d+$", "", gpu[0]).lower() if gpu else "cpu"
        if model_mib:
            facts.model_memory_gib = model_mib / _MIB
