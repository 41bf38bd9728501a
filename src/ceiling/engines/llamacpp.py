"""llama.cpp's second flavour, engine ``llamacpp-python``: llama-cpp-python's OpenAI server
(``python -m llama_cpp.server``). The default flavour, engine ``llamacpp``, is the real
``llama-server`` binary (llamacpp_server.py), which shares this module's log grammar for
llama.cpp's own loader lines (both grammars are data in llamacpp_log.py).

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

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from ceiling.engines.base import Engine
from ceiling.engines.flags import ValueType
from ceiling.engines.profiling import ProfilerSetup, unsupported

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

# values llama-cpp-python's parser reads as booleans (``_parse_bool_arg``: --verbose false)
_BOOL_WORDS = frozenset({"1", "on", "t", "true", "y", "yes", "0", "off", "f", "false", "n", "no"})


def _json_object(value: str) -> bool:
    try:
        return isinstance(json.loads(value), dict)
    except json.JSONDecodeError:
        return False


class LlamaCppEngine(Engine):
    """llama-cpp-python's server (``llama_cpp.server``)."""

    name = "llamacpp-python"
    display_name = "llama-cpp-python"
    ready_line = "Application startup complete."
    # the binding loads libllama (and ggml's CPU backends) with ctypes when imported
    kernels_import = "import llama_cpp\nllama_cpp.llama_backend_init()\n"
    health_paths: tuple[str, ...] = ("/v1/models",)
    default_port = 8080
    env_prefixes: tuple[str, ...] = ()
    dist_names: tuple[str, ...] = ("llama_cpp_python",)
    install_dir = "llamacpp"  # beside llama-server (scripts/install-llamacpp.sh)
    server_module = "llama_cpp.server"
    model_flag = "--model"
    served_name_flag = "--model_alias"
    flags_module = "llama_cpp.server"
    dash_underscore_alias = False  # plain argparse over pydantic field names: --n_ctx only
    # llama-cpp-python offloads no layer unless told (n_gpu_layers defaults to 0)
    cpu_flags: ClassVar[dict[str, tuple[str, ...]]] = {"--n_gpu_layers": ("", "0")}
    # its parser's own value readers (data/dump_args.py names them): booleans as words
    # (``--verbose false``, ``_parse_bool_arg``) and JSON objects (``_parse_json_object_arg``)
    value_types = {  # noqa: RUF012 (class data, read only)
        "bool_word": ValueType(
            lambda v: v.strip().lower() in _BOOL_WORDS, "true or false (1/0, yes/no, on/off)"
        ),
        "json_object": ValueType(_json_object, "a JSON object"),
    }
    log_phases: ClassVar[Sequence[tuple[re.Pattern[str], str]]] = _PHASES
    # no ``ignore_eos`` (see the module docstring); prompt log-probabilities through ``echo`` +
    # ``logprobs`` need every position's logits kept
    ignore_eos_field = None
    prompt_logprobs_hint = "start the server with --logits_all true to get prompt log-probabilities"

    def profiler(
        self, version: str | None, trace_dir: Path, steps: int, prefix: str = "ceiling"
    ) -> ProfilerSetup:
        """llama.cpp has no torch profiler and no endpoint that records its kernels (ggml runs
        its own graph; tools/server/server.cpp serves no profiling route). What it offers
        instead: each response's ``timings`` (prompt_ms, predicted_ms, predicted_per_token_ms),
        ``/metrics`` with ``--metrics``, and outside tools: Nsight Systems on a CUDA build,
        ``test-backend-ops perf`` per op."""
        return unsupported(
            self.name,
            version,
            f"{self.display_name} has no profiler of its own that ceiling can switch on (no "
            "torch profiler, no profiling endpoint): no flag or variable records its kernels",
            alternative="per-request `timings` (predicted_per_token_ms) and `/metrics` "
            "(--metrics); kernel times from outside: `nsys profile --cuda-graph-trace=node "
            "llama-server ...` on a CUDA build, or `test-backend-ops perf -o MUL_MAT`",
        )

    def install_hint(self) -> str:
        return (
            "install it with `bash scripts/install-llamacpp.sh` (builds llama.cpp once for both "
            "flavours, ~4-6 min on 2 cores) into .engines/llamacpp, or point `python:` in the variant at an "
            "environment that has `llama-cpp-python[server]`"
        )
