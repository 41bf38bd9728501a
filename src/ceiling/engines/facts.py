"""EngineFacts: what an engine's start-up log says about a deployment (``ceiling inspect``).

Each adapter's log grammar fills these (``Engine.parse_log``); the rules in ``ceiling.diagnose``
read them. The findings derived from them are the diagnosis's: ``ceiling.diagnose.facts`` adds
them to this model (engines never import the diagnosis).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

SCHEMA_VERSION = 1


class StreamingTraits(BaseModel, frozen=True):
    """How an engine streams tokens, for telling an API server that fell behind from a slow
    engine (doctor's ``frontend-bound``): the adapter states it, the rule reads only this.

    ``engine_side_times``: its per-request queue/prefill/decode histograms are timestamped in
    the engine core, so client time beyond them is the API server's (or the network's).
    ``merges_waiting_outputs``: outputs that waited for the API server leave as one chunk, so
    several tokens per chunk mean it fell behind. ``interval_arg``: the server argument (as the
    start-up log's non-default args name it) that streams every N tokens instead (default 1).
    """

    engine_side_times: bool = False
    merges_waiting_outputs: bool = False
    interval_arg: str | None = None


class StartFailure(BaseModel):
    """Why a start-up failed, as its log says: the cause (``data/death_causes.yaml``), the lines
    that show it, the fix; flags the parser refused that the engine removed, with why."""

    cause: str
    evidence: list[str] = Field(default_factory=list)
    fix: str = ""
    removed_flags: list[str] = Field(default_factory=list)


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
    # kernels JIT-compiled at start-up before the server is ready (vLLM's DeepGEMM warm-up):
    # what, how many shapes, how many the log saw done, elapsed + remaining by its progress bar
    warmup: str | None = None
    warmup_shapes: int | None = None
    warmup_done: int | None = None
    warmup_eta_s: float | None = None
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
    compile_backend: str | None = None  # torch.compile's backend (vLLM: inductor, eager)
    compilation: str | None = None  # what ran, in plain words (the grammar's reading of the above)
    cudagraph_mode: str | None = None
    # llama.cpp: layers whose weights are on the GPU (-ngl) of the model's (repeating + output)
    gpu_layers: int | None = None
    gpu_layers_total: int | None = None
    flash_attention: bool | None = None
    cudagraph_capture_sizes: list[int] | None = None
    max_cudagraph_capture_size: int | None = None
    custom_ops: list[str] | None = None
    fusion_passes: dict[str, bool] | None = None
    enabled_fusions: list[str] | None = None
    compile_cache_hit: bool | None = None
    torch_compile_s: float | None = None
    cudagraph_downgrade: str | None = None  # the mode the engine lowered CUDA graphs to
    weight_only_fallback: str | None = None  # "FP4"/"FP8" run weight-only (no native compute)
    spec_mean_acceptance: float | None = None  # speculative decoding, last metrics line
    spec_method: str | None = None  # predict's word for the engine's method: mtp|eagle|eagle3|ngram
    spec_tokens: int | None = None  # drafted tokens per step
    spec_acceptance_rate_pct: float | None = None
    custom_allreduce_disabled: bool | None = None
    custom_allreduce_reason: str | None = None
    nccl_version: str | None = None
    weights_load_s: float | None = None
    model_load_s: float | None = None
    model_memory_gib: float | None = None
    kv_cache_memory_gib: float | None = None
    kv_cache_tokens: int | None = None  # every sequence's cells together
    kv_unified: bool | None = None  # llama.cpp: one KV pool shared by all sequences
    max_concurrency: float | None = None
    max_concurrency_tokens_per_request: int | None = None
    graph_capture_s: float | None = None
    graph_capture_gib: float | None = None
    init_engine_s: float | None = None
    startup_s: float | None = None
    ready: bool = False
    start_failure: StartFailure | None = None  # the log shows the start-up failing, and why
    warnings: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    # per-fact source lines, for findings to quote (kept out of JSON: findings carry their own)
    evidence: dict[str, list[str]] = Field(default_factory=dict, exclude=True)

    def running_cap(self) -> int | None:
        """The running-sequence cap the log shows set: vLLM's ``max_num_seqs``, SGLang's
        ``max_running_requests``, llama-server's ``n_slots`` (None when left at the engine's
        default)."""
        for arg in ("max_num_seqs", "max_running_requests", "n_slots"):
            cap = self.non_default_args.get(arg)
            if isinstance(cap, int):
                return cap
        return None

    def add_evidence(self, key: str, line: str) -> None:
        lines = self.evidence.setdefault(key, [])
        if line not in lines and len(lines) < 6:
            lines.append(line)
