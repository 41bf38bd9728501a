"""predict's nouns: what to predict (``PredictRequest``) and the answer (``Prediction``).

Their own module so that the computation (``core``), the what-if variants (``whatif``), the CPU
backend (``cpu``) and every reader (doctor, reports, renderers) name them without importing
each other. Component names in ``components_ms`` are stable: ``weights``, ``kv``,
``collectives``, ``launch``, ``host`` and, when the roofline says so, ``compute``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    JsonValue,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from ceiling.choices import Allreduce, PredictEngine, SpecMethod
from ceiling.spec.deployment import Deployment
from ceiling.spec.hardware import Hardware

SCHEMA_VERSION = 1

COMPONENTS = ("weights", "kv", "collectives", "launch", "host", "compute")


class PredictRequest(BaseModel):
    """What to predict. ``gpus`` defaults to tp x pp x dp; extra GPUs become DP replicas.

    ``hardware``: the hardware itself (a probed box of GPUs, or a measured CPU); when absent,
    ``gpu``/``link`` name catalog entries. A CPU is predicted by its floors only (``cpu.py``).
    """

    model: str
    gpu: str = ""
    hardware: Hardware | None = None
    gpus: int | None = Field(None, ge=1)
    link: str | None = None
    tp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    dp: int | None = Field(None, ge=1)
    dcp: int = Field(1, ge=1, description="decode context parallel size (vLLM), divides tp")
    engine: PredictEngine = "vllm"
    allreduce: Allreduce = "auto"
    cuda_graphs: bool = True
    flash_attention: bool | None = Field(
        None, description="llama.cpp: flash attention on (None: on, the CUDA build's auto)"
    )
    batch: int = Field(1, ge=1)
    context: int = Field(1024, ge=1, description="KV length per sequence during decode")
    prompt_len: int = Field(1024, ge=1)
    kv_dtype: str = "auto"
    weight_format: str | None = Field(None, description="override: bf16, fp8, nvfp4, int4-g32, ...")
    profile: str | None = None
    power_limit: float | None = Field(None, gt=0, description="board power cap, W")
    mem_clock: float | None = Field(None, gt=0, description="memory clock, MHz (nvidia-smi)")
    attention_backend: str | None = Field(None, description="engine's attention backend flag")
    moe_backend: str | None = Field(None, description="engine's MoE runner backend")
    async_scheduling: bool | None = Field(None, description="None: the engine's default")
    spec: SpecMethod = Field("none", description="speculative decoding method (predict.specdec)")
    spec_tokens: int | None = Field(None, ge=1, le=16, description="drafted tokens per step")
    spec_draft_layers: int | None = Field(None, ge=1, le=8, description="EAGLE draft layers")
    spec_acceptance_rate: float | None = Field(
        None, ge=0, le=1, description="accepted / drafted tokens (vLLM's draft acceptance rate)"
    )
    spec_acceptance_length: float | None = Field(
        None, ge=1, le=17, description="mean tokens per verify step, the bonus token included"
    )
    trtllm_options: dict[str, JsonValue] | None = Field(
        None, description="TensorRT-LLM LLM-API options (engine_options, trtllm_options.yaml)"
    )
    trtllm_config: str | None = Field(
        None, description="a TensorRT-LLM --extra_llm_api_options YAML file to read them from"
    )
    what_if: bool = False

    @model_validator(mode="after")
    def _has_hardware(self) -> PredictRequest:
        if not self.gpu and self.hardware is None:
            raise ValueError("name a GPU (gpu) or pass the hardware")
        return self

    def gpu_name(self) -> str:
        """The catalog GPU (or GPU file) to predict on: the hardware's, else ``gpu``."""
        hw = self.hardware
        return hw.name if hw is not None and hw.kind == "gpu" else self.gpu

    def link_name(self) -> str | None:
        """The link kind asked for: ``link``, else the probed hardware's."""
        hw = self.hardware
        return self.link or (hw.link if hw is not None and hw.kind == "gpu" else None)


class Interval(BaseModel):
    """The 80 % interval around ``expected`` (predict.interval, data/predict/intervals.yaml):
    the measured step should fall in [low, high] on 8 of 10 setups like this one."""

    coverage: float = Field(description="the share of measurements the interval is meant to hold")
    step_ms_low: float
    step_ms_high: float
    tok_s_low: float = Field(description="per stream, = 1000 / step_ms_high")
    tok_s_high: float
    spread: float = Field(description="log-space sigma behind the interval")
    reason: str = Field(description="what widens it: the evidence and what predict cannot express")


class WhatIf(BaseModel):
    change: str
    decode_tok_s_per_stream: float = Field(description="expected, with this change")
    tok_s_low: float | None = Field(None, description="its interval's low (80 %)")
    tok_s_high: float | None = Field(None, description="its interval's high (80 %)")
    delta_pct: float = Field(description="expected tok/s change vs the request")
    decode_ms_per_token: float
    fits_in_memory: bool
    bound_tok_s_per_stream: float = Field(0.0, description="the bound with this change")
    moved: str = Field("", description="the component that moves most, 'name a -> b ms'")
    note: str = ""


class OpRecord(BaseModel):
    """One operation of the decode step (per GPU, per step)."""

    name: str
    count: float = Field(description="calls per step (per token at batch 1)")
    ms: float = Field(description="time per step, all calls")
    source: str = Field(description="trace | table | profile | prior | engine (host estimate)")
    confidence: float = Field(description="0-1: how much the number is trusted")
    kernel: str = Field("", description="kernel family (data/predict/kernels.yaml)")
    note: str = ""


class StepBlock(BaseModel):
    """One figure of the decode step: ``expected`` or ``bound``."""

    decode_ms_per_token: float
    decode_tok_s_per_stream: float
    components_ms: dict[str, float]
    ops: list[OpRecord]
    interval: Interval | None = Field(None, description="expected only: its 80 % interval")


class BatchPoint(BaseModel):
    batch: int
    step_ms: float
    tok_s_per_stream: float
    aggregate_tok_s: float
    step_ms_low: float | None = None
    step_ms_high: float | None = None
    tok_s_per_stream_low: float | None = None
    tok_s_per_stream_high: float | None = None


class ModelSummary(BaseModel):
    """The model as the prediction read it (spec.model.ModelSpec, summarised)."""

    name: str
    architecture: str
    attention: str
    layers: int
    hidden_size: int
    total_params_B: float
    active_params_B: float
    weight_GB: float
    weight_bytes: int
    quantization: str
    experts: int
    top_k: int

    def line(self) -> str:
        """One line: name, architecture, size, format."""
        size = (
            f"{self.total_params_B} B params"
            if self.total_params_B >= 0.1
            else f"{self.weight_bytes / 1e6:.3g} MB of weights"
        )
        parts = [
            self.name,
            self.architecture,
            f"{self.layers} layers, hidden {self.hidden_size}",
            size,
            f"{self.active_params_B} B active" if self.experts else "",
            self.quantization,
            f"{self.weight_GB} GB of weights" if self.weight_GB >= 0.1 else "",
        ]
        return ", ".join(p for p in parts if p)


class HardwareUsed(BaseModel):
    """The hardware as the prediction used it (catalog entry resolved, achieved bandwidth)."""

    kind: Literal["gpu", "cpu"] = "gpu"
    gpu: str | None = Field(None, description="catalog GPU name (None on a CPU)")
    cpu: str | None = Field(None, description="the CPU's name (CPU floors only)")
    gpus: int
    link: str | None
    p2p: bool | None
    bw_GBps_achieved: float
    memory_GiB: float | None
    gflops: float | None = Field(None, description="CPU: the matrix-multiply rate used")


class _Sparse(BaseModel):
    """A block whose absent facts (None) are left out of the JSON, as before they were typed:
    a reader sees only the keys that apply to this step."""

    @model_serializer(mode="wrap")
    def _drop_none(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v is not None}


class SharedExpertStream(BaseModel):
    """The shared expert on a second CUDA stream: what it hid and the engine's rule."""

    hidden_ms: float
    rule: str


class Speculative(BaseModel):
    """Speculative decoding in the step (``predict --spec``): the draft, the verify, the
    acceptance (components, ops and the other details are per generated token)."""

    method: str
    draft_tokens: int
    acceptance_length: float
    acceptance_source: str
    verify_ms: float
    draft_ms: float
    step_ms: float
    bound_acceptance_length: int
    draft_model: str
    # what the engine's spec path adds (predict.specpath): unsplit verify KV, piecewise graphs
    engine_path: list[str] = Field(default_factory=list)
    host_issue_ms: float = 0.0  # host time to issue the step's forwards (piecewise graphs)


class GgufWeightsRead(BaseModel):
    """One ggml weight type of a GGUF file as one decode token reads it (llama.cpp)."""

    type: str = Field(description="ggml type: Q4_K, Q6_K, Q8_0, F16, IQ4_XS, ...")
    matrices: int = Field(description="weight matrices of this type read per token")
    bytes: float = Field(description="bytes of this type one token reads (routed experts only)")


class LlamaCppDetails(BaseModel):
    """llama.cpp's side of a decode step (``predict --engine llamacpp``): the GGUF file read,
    its weight types, and the settings that change its kernels."""

    gguf: str
    arch: str = Field(description="the GGUF's general.architecture")
    flash_attention: bool
    bytes_per_token: float = Field(description="weights in their GGUF types + KV at the context")
    kv_bytes: float = Field(description="the KV cache (f16) read at the context")
    weights: list[GgufWeightsRead]
    kernel_profile: str | None = Field(
        None, description="the calibrate --engine llamacpp profile used (None: priors only)"
    )


class StepDetails(_Sparse):
    """The facts behind a decode step (per GPU, per step). The CPU floors fill the first block
    (the model's footprint) and the byte/FLOP counts; the GPU step model everything else that
    applies (collective counts only under TP/EP/PP, expert counts only for MoE)."""

    # the model's footprint as the CPU floors read it (doctor.json's `model` block shows it)
    params: int | None = None
    kv_bytes_per_token: int | None = None
    dtype: str | None = None
    source: str | None = None
    weight_bytes_read_per_gpu: int
    weight_bytes_read_by_kind: dict[str, int] | None = None
    kv_bytes_read_per_gpu: int
    kernels_per_step: int | None = None
    gemm_kernels_per_step: int | None = None
    flops_per_gpu: float
    allreduce_impl: str | None = None
    collective_calls_per_step: int | None = None
    allreduces: int | None = None
    allreduce_bytes: int | None = None
    allreduce_us: float | None = None
    alltoalls: int | None = None
    alltoall_us: float | None = None
    pp_sends: int | None = None
    send_us: float | None = None
    trace_evidence: list[str] | None = Field(None, description="what the engine's trace timed")
    shared_expert_stream: SharedExpertStream | None = None
    expected_distinct_experts: float | None = None
    speculative: Speculative | None = None
    llamacpp: LlamaCppDetails | None = None


class EvidenceSummary(_Sparse):
    """Which evidence the expected figure stands on (empty for a CPU's floors)."""

    tables: str | None = Field(None, description="the per-op tables used, or why none")
    share_of_expected_by_source: dict[str, float] | None = None
    low_confidence_ops: list[str] | None = None


class DeploymentUsed(Deployment):
    """The deployment predicted, with the allreduce implementation the engine's rule chose."""

    allreduce_impl: str


class Prediction(BaseModel):
    """The decode step of one configuration: ``expected`` (what this engine's default kernels
    deliver; the top-level figures) and ``bound`` (the physical ceiling).

    ``kind`` ``cpu-floors``: a CPU, predicted by its floors only (weights, KV and compute at the
    CPU's rates): there is no ``expected`` (launch and host time are not predicted), and the
    top-level figures are the bound.
    """

    schema_version: int = SCHEMA_VERSION
    kind: Literal["analytic", "cpu-floors"] = "analytic"
    request: PredictRequest
    model: ModelSummary
    hardware: HardwareUsed
    deployment: DeploymentUsed
    batch: int
    context: int
    decode_ms_per_token: float
    decode_tok_s_per_stream: float
    aggregate_tok_s: float
    components_ms: dict[str, float]
    component_share: dict[str, float]
    component_kind: dict[str, str]
    fits_in_memory: bool
    memory_GiB_per_gpu: dict[str, float]
    kv_capacity_tokens: int | None = Field(description="None: not predicted (CPU)")
    max_batch_at_context: int | None = Field(description="None: not predicted (CPU)")
    batch_curve: list[BatchPoint]
    prefill: dict[str, float]
    details: StepDetails
    assumptions: list[str]
    expected: StepBlock | None = Field(
        None, description="what this engine's default kernels deliver (= the top-level figures)"
    )
    bound: StepBlock | None = Field(
        None, description="the physical ceiling: best kernels, best collective, no host time"
    )
    evidence: EvidenceSummary = Field(
        default_factory=EvidenceSummary,
        description="which evidence was used (tables, profile, priors)",
    )
    what_if: list[WhatIf] = Field(default_factory=list)

    @property
    def expected_tok_s(self) -> float | None:
        """Expected decode tok/s per stream (None when only floors were predicted)."""
        return self.expected.decode_tok_s_per_stream if self.expected is not None else None

    @property
    def bound_tok_s(self) -> float | None:
        """The bound: decode tok/s per stream no setting of this layout can beat."""
        return self.bound.decode_tok_s_per_stream if self.bound is not None else None
