"""What ``ceiling.diagnose`` reads of each engine, as data: the engines' knowledge, no I/O.

One :class:`EngineReading` per engine: the grammar of its start-up log (``*_log.py``), the marker
that says a log is its own and the order engines are asked in, how to fix each finding with its
flags, the variables of a variant's environment its log does not show, and how it streams. The
adapters (``vllm.py``, ``sglang.py``, ...) read the same objects (``Engine.reading``), and
``ceiling.diagnose`` reads them from here, so that the diagnosis imports no adapter (an adapter
finds its engine, dumps its flags through a subprocess, launches it: issue 40's closure rule).
A new engine with a log grammar adds its entry to :data:`READINGS`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ceiling.engines.death import start_failure
from ceiling.engines.facts import EngineFacts, StreamingTraits
from ceiling.engines.llamacpp_log import LLAMA_SERVER_LOG, LLAMACPP_LOG
from ceiling.engines.logparse import LogGrammar, read_log
from ceiling.engines.names import canonical_name
from ceiling.engines.sglang_log import SGLANG_LOG
from ceiling.engines.tables import removed_flags_table
from ceiling.engines.vllm_log import VLLM_LOG


@dataclass(frozen=True)
class FilePrediction:
    """An engine whose server is predicted from the weights file it serves (the file's own
    types, not a model config's dtype): which of predict's engines prices it and how its
    variant shows the options that predictor reads. The diagnosis reads this trait, never the
    engine's name (issue 40: engine knowledge lives under ``engines/``)."""

    #: ``PredictRequest.engine`` of this file's predictor
    predict_engine: str
    #: the engine as the doctor's notes name it
    label: str
    #: a variant's environment variable whose presence at all turns CUDA graphs off
    graphs_off_env: str
    #: a variant's flags that set flash attention (``on``/``off``)
    flash_attention_flags: tuple[str, ...]


#: llama.cpp's servers (llama-server, llama-cpp-python): a GGUF through ``predict --engine
#: llamacpp``; ggml-cuda turns graphs off when GGML_CUDA_DISABLE_GRAPHS is set to anything
GGUF_PREDICTION = FilePrediction(
    predict_engine="llamacpp",
    label="llama.cpp",
    graphs_off_env="GGML_CUDA_DISABLE_GRAPHS",
    flash_attention_flags=("flash-attn", "fa"),
)


@dataclass(frozen=True)
class EngineReading:
    """How the diagnosis reads one engine (see the module docstring)."""

    name: str
    #: the start-up log's grammar (``logparse.read_log`` reads it)
    grammar: LogGrammar
    #: a start-up log is this engine's when the marker occurs in its first 400 lines; engines
    #: are asked in ``claim_rank`` order (lower first)
    marker: re.Pattern[str]
    claim_rank: int = 100
    #: finding id -> how to fix it with THIS engine's flags; a finding whose id is missing gets
    #: the rules' engine-neutral advice (diagnose/rules*.py)
    finding_fixes: Mapping[str, str] = field(default_factory=dict)
    #: variables of a variant's environment that change the engine without a line in its log
    #: (llama.cpp's GGML_CUDA_DISABLE_GRAPHS): the doctor hands their values to the grammar as
    #: ``ceiling: variant env NAME=VALUE`` lines; no other variable is read (secrets stay out)
    facts_env: tuple[str, ...] = ()
    #: how it streams (doctor's frontend-bound check); None: not known, the check is skipped
    streaming: StreamingTraits | None = None
    #: predicted from the weights file it serves (None: from the model config, by predict's GPU
    #: model)
    file_prediction: FilePrediction | None = None

    def claims_log(self, lines: list[str]) -> bool:
        """Whether ``lines`` (ANSI colour removed) are this engine's start-up log."""
        return bool(self.marker.search("\n".join(lines[:400])))

    def parse_log(self, lines: list[str], facts: EngineFacts) -> None:
        """Fill ``facts`` from the start-up log ``lines`` (ANSI colour and ``\\r`` removed); a
        start-up that died gets its cause, with the flags the engine removed named."""
        read_log(self.grammar, lines, facts)
        if not facts.ready:
            removed = removed_flags_table(self.name).flags
            facts.start_failure = start_failure(lines, self.name, removed)


VLLM = EngineReading(
    name="vllm",
    grammar=VLLM_LOG,
    marker=re.compile(r"vLLM|vllm|LLM engine \(v|non-default args"),
    claim_rank=100,
    finding_fixes={
        # only given where the rule's preconditions hold (diagnose/rules*.py)
        "quant-fusion-off.fuse_norm_quant": "-cc.pass_config.fuse_norm_quant=true (needs "
        "-cc.mode=VLLM_COMPILE)",
        "quant-fusion-off.fuse_act_quant": "-cc.pass_config.fuse_act_quant=true (needs "
        "-cc.mode=VLLM_COMPILE)",
        "allreduce-fusion-off": "-cc.pass_config.fuse_allreduce_rms=true (on by default at "
        "-O2/-O3 on compute capability 9.0/10.x with FlashInfer installed)",
        "compile-off": "compile again: -O2 (the default) or -cc.mode=VLLM_COMPILE",
        "startup-warmup": "VLLM_DEEP_GEMM_WARMUP=skip (shapes then compile at first use, in "
        "the first requests), or keep ~/.cache/vllm across restarts (the JIT cache) so the "
        "next start finds them compiled",
        "custom-allreduce-off.pcie": "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1 (FlashInfer's "
        "PCIe one-shot allreduce for small messages; vLLM >= 0.32, opt-in)",
        "custom-allreduce-off.user": "remove --disable-custom-all-reduce",
        "eager-mode": "remove --enforce-eager (and -cc.cudagraph_mode=NONE)",
        "eager-mode.cpu": "remove --enforce-eager: the CPU build then compiles the model "
        "(torch.compile; start-up takes longer)",
        "kv-capacity.memory": "raise --gpu-memory-utilization",
        "kv-capacity.memory-cpu": "a larger --kv-cache-memory-bytes (VLLM_CPU_KVCACHE_SPACE, "
        "in GiB, overrides it when set)",
        "frontend-bound": "give the API server CPU time (other load off its cores); if it is "
        "busy with its own work, more API server processes (--api-server-count)",
        "kv-capacity.fp8": "--kv-cache-dtype fp8",
        "kv-capacity.max-len": "a lower --max-model-len",
        "kv-capacity.fewer-seqs": "fewer sequences (--max-num-seqs)",
        "concurrency-cap": "raise --max-num-seqs",
        "partial-cudagraphs": "pick an attention backend with full-graph support "
        "(--attention-backend)",
        "partial-cudagraphs.size": "raise -cc.max_cudagraph_capture_size to the batch (and "
        "--max-num-batched-tokens if it caps the capture sizes)",
        "expert-parallel-pcie": "drop --enable-expert-parallel (experts sharded by TP)",
        "spec-decode-acceptance": "fewer --speculative-config num_speculative_tokens, or "
        "no speculation at high concurrency",
        "default-moe-config": "tune the fused-MoE config for this GPU/shape "
        "(benchmarks/kernels/benchmark_moe.py) or pick another MoE backend",
    },
    # Checked: vLLM 0.32 v1/metrics/stats.py (queue, prefill and decode times from engine-core
    # timestamps), v1/engine/output_processor.py (RequestOutputCollector merges outputs that
    # waited), config/scheduler.py (stream_interval, default 1)
    streaming=StreamingTraits(
        engine_side_times=True, merges_waiting_outputs=True, interval_arg="stream_interval"
    ),
)

SGLANG = EngineReading(
    name="sglang",
    grammar=SGLANG_LOG,
    marker=re.compile(r"server_args=ServerArgs|sglang|The server is fired up"),
    # before vLLM: SGLang's logs can mention vLLM, not the other way round
    claim_rank=10,
    finding_fixes={
        "eager-mode": "remove --disable-cuda-graph; raise --cuda-graph-max-bs to the batch",
        "custom-allreduce-off.user": "remove --disable-custom-all-reduce",
        "kv-capacity.memory": "raise --mem-fraction-static",
        "kv-capacity.fp8": "--kv-cache-dtype fp8_e4m3",
        "kv-capacity.max-len": "a lower --context-length",
        "kv-capacity.fewer-seqs": "fewer sequences (--max-running-requests)",
        "concurrency-cap": "raise --max-running-requests",
        "partial-cudagraphs.size": "raise --cuda-graph-max-bs to the batch",
        "expert-parallel-pcie": "drop --ep-size (experts sharded by TP)",
    },
)

LLAMA_SERVER = EngineReading(
    name="llamacpp",
    grammar=LLAMA_SERVER_LOG,
    marker=re.compile(r"^\d+\.\d+\.\d+\.\d+ [IWEDT] (srv|cmn|slot) ", re.M),
    # before llamacpp-python: both print llama.cpp's loader lines
    claim_rank=40,
    finding_fixes={
        "kv-capacity": "more context: raise --ctx-size (with a unified KV cache, the default "
        "without --parallel, all slots share it; with --parallel N and no --kv-unified each "
        "request gets ctx-size / N)",
        "partial-offload": "offload every layer: --n-gpu-layers 999 (or a smaller quant that "
        "fits the GPU)",
        "flash-attn-off": "--flash-attn on",
        "eager-mode": "unset GGML_CUDA_DISABLE_GRAPHS (the build has CUDA graphs: USE_GRAPHS = 1)",
    },
    facts_env=("GGML_CUDA_DISABLE_GRAPHS",),
    file_prediction=GGUF_PREDICTION,
)

LLAMACPP_PYTHON = EngineReading(
    name="llamacpp-python",
    grammar=LLAMACPP_LOG,
    marker=re.compile(r"^(llama_model_loader|print_info|llama_context|load_tensors): ", re.M),
    claim_rank=50,
    finding_fixes={
        "kv-capacity": "more context: raise --n_ctx (the server runs one request at a time: "
        "concurrent streams need another server or another engine)",
    },
    file_prediction=GGUF_PREDICTION,
)

#: every engine with a log grammar, in the adapters' registration order (``engines/__init__``)
READINGS: tuple[EngineReading, ...] = (VLLM, SGLANG, LLAMA_SERVER, LLAMACPP_PYTHON)


def reading(name: str) -> EngineReading | None:
    """The reading of engine ``name`` (aliases accepted); CeilingError for an unknown engine,
    None for a known one without a log grammar."""
    key = canonical_name(name)
    return next((r for r in READINGS if r.name == key), None)


def file_prediction(*engines: str | None) -> FilePrediction | None:
    """The file prediction of the first of ``engines`` (names as the doctor found them: an
    option, a variant, ``owned_by``, a log's) that is predicted from its weights file."""
    for name in engines:
        for r in READINGS:
            if r.name == name and r.file_prediction is not None:
                return r.file_prediction
    return None


def file_predictor(predict_engine: str) -> FilePrediction | None:
    """The file prediction whose predictor is predict's engine ``predict_engine``, if any."""
    return next(
        (
            r.file_prediction
            for r in READINGS
            if r.file_prediction and r.file_prediction.predict_engine == predict_engine
        ),
        None,
    )
