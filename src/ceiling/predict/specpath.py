"""What an engine's speculative step runs beyond the draft and verify passes' own kernels.

Read in the engines' source (``data/predict/spec_decode.yaml`` ``engine_paths``, each rule with
the file it comes from):

- **the first draft pass** runs over every token the target just verified (B x (k+1)), later
  passes over the B sampled positions (vLLM ``llm_base_proposer.propose``, SGLang
  ``forward_draft_extend_after_decode``);
- **sampling**: the rejection sampler's kernels once per step, the draft's argmax and input
  updates once per pass (small kernels);
- **the verify attention without a KV split** (vLLM with FA2 or its Triton backend): at k+1
  query tokens per sequence both lose the split of the KV sequence, so the full-attention
  layers stream their KV cache at a small, measured share of the bandwidth;
- **piecewise CUDA graphs** (vLLM): an attention backend below UNIFORM_BATCH support turns the
  target's full graph into piecewise graphs under speculative decoding, and the drafter always
  runs piecewise: the host then replays a graph per stretch and issues every splitting op's
  kernels eagerly; the step is the slower of the GPU and that host chain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field

from ceiling.predict.opspec import OpRow
from ceiling.predict.resolved import Setup
from ceiling.predict.step import kv_bytes_per_token_gpu
from ceiling.spec._data import DataModel
from ceiling.spec.model import ModelSpec


class AttentionRule(DataModel):
    """One rule of an engine's default attention backend (first match wins)."""

    sm_major: int | None = None
    kv: Literal["fp8", "bf16"] | None = None
    backend: str


class EnginePath(DataModel):
    """``spec_decode.yaml`` ``engine_paths.<engine>``."""

    first_draft_pass: Literal["all_tokens", "batch"] = "batch"
    sampler_kernels: int = Field(0, ge=0)
    draft_pass_kernels: int = Field(0, ge=0)
    default_attention: list[AttentionRule] = Field(default_factory=list)
    no_kv_split_backends: list[str] = Field(default_factory=list)
    no_kv_split_bw_fraction: float = Field(1.0, gt=0, le=1)
    no_kv_split_source: str = ""
    piecewise_backends: list[str] = Field(default_factory=list)
    full_graph_sm_major: list[int] = Field(default_factory=list)
    draft_piecewise: bool = False
    eager_kernels_per_split: dict[str, int] = Field(default_factory=dict)  # gqa | mla | linear


# the user's --attention-backend (vLLM's own names) -> the kernel the rules speak of
_USER_BACKEND = {"flash_attn": "fa", "flashinfer": "flashinfer", "triton_attn": "triton_attn"}


def attention_backend(s: Setup, path: EnginePath) -> str:
    """The backend that runs the full-attention layers: the user's, else the engine's default
    for this GPU and KV dtype ('' when the engine's rules do not say)."""
    sm_major = s.gpu.sm // 10
    user = _USER_BACKEND.get((s.attention_backend or "").lower().replace("-", "_"))
    if user == "fa":
        return "fa3" if sm_major == 9 else "fa2"
    if user:
        return user
    kv = "fp8" if s.kv_bytes < 2 else "bf16"
    for rule in path.default_attention:
        if rule.sm_major is not None and rule.sm_major != sm_major:
            continue
        if rule.kv is not None and rule.kv != kv:
            continue
        return rule.backend
    return ""


def _splits(spec: ModelSpec) -> dict[str, int]:
    """Splitting ops (attention-like layers) of a model, by kind."""
    out = {"gqa": 0, "mla": 0, "linear": 0}
    for layer in spec.layers:
        kind = layer.attention if layer.attention in ("mla", "linear") else "gqa"
        out[kind] += 1
    return out


@dataclass
class PathCost:
    """The spec step's extra ops (per step, before the acceptance divides them), the host
    chain when graphs are piecewise, and what was decided."""

    ops: list[OpRow] = field(default_factory=list)
    host_issue_ms: float = 0.0
    notes: list[str] = field(default_factory=list)


def extra_costs(
    s: Setup, path: EnginePath, batch: int, context: int, k: int, draft: ModelSpec | None
) -> PathCost:
    """The costs of ``path`` for one speculative step of ``batch`` sequences at ``context``."""
    out = PathCost()
    n_small = path.sampler_kernels + (k * path.draft_pass_kernels if draft is not None else 0)
    if n_small:
        ms = n_small * s.small_kernel_us / 1e3
        out.ops.append(
            OpRow(
                "spec.sampling",
                "sampling",
                float(n_small),
                ms,
                0.0,
                "prior",
                0.4,
                "elementwise",
                "rejection sampler + the draft's argmax and input updates",
                0.0,
                0.0,
            )
        )
    backend = attention_backend(s, path) if s.dep.engine == "vllm" else ""
    full_layers = sum(1 for layer in s.spec.layers if layer.attention not in ("linear", "mla"))
    if backend in path.no_kv_split_backends and full_layers:
        kv_tok, _ = kv_bytes_per_token_gpu(s, context)
        draft_layers = 0
        if draft is not None:
            draft_layers = sum(1 for la in draft.layers if la.attention not in ("linear", "mla"))
        # the draft's first pass reads its own layers' KV at k+1 queries too
        nbytes = batch * context * kv_tok * (1 + draft_layers / full_layers)
        slow_bw = min(s.bw_GBps, s.gpu.mem_bw_GBps * path.no_kv_split_bw_fraction * batch)
        excess = nbytes / (slow_bw * 1e6) - nbytes / (s.bw_GBps * 1e6)
        if excess > 0:
            out.ops.append(
                OpRow(
                    "verify.attention_no_kv_split",
                    "attention",
                    float(full_layers),
                    excess,
                    0.0,
                    "prior",
                    0.5,
                    "attn_gqa",
                    f"{backend} at {k + 1} query tokens per sequence: no KV split, "
                    f"KV read at {slow_bw:.0f} GB/s ({path.no_kv_split_source.strip()})",
                    0.0,
                    nbytes,
                )
            )
            out.notes.append(f"verify attention on {backend} without a KV split")
    if s.dep.engine == "vllm" and s.dep.cuda_graphs:
        out.host_issue_ms, note = _piecewise_host(s, path, backend, k, draft)
        if note:
            out.notes.append(note)
    return out


def _piecewise_host(
    s: Setup, path: EnginePath, backend: str, k: int, draft: ModelSpec | None
) -> tuple[float, str]:
    """(host ms to issue the step's piecewise forwards, what runs piecewise)."""
    unit = s.eager_kernel_us / 1e3
    per = path.eager_kernels_per_split

    def chain(spec: ModelSpec) -> float:
        n = _splits(spec)
        return (sum(n.values()) + 1) * unit + sum(per.get(kk, 0) * v for kk, v in n.items()) * unit

    target_piecewise = backend in path.piecewise_backends and (
        s.gpu.sm // 10 not in path.full_graph_sm_major
    )
    total = chain(s.spec) if target_piecewise else unit  # a full graph: one replay
    what = [f"target piecewise ({backend} below UNIFORM_BATCH)"] if target_piecewise else []
    if draft is not None and path.draft_piecewise:
        total += k * (chain(draft) + path.draft_pass_kernels * unit)
        what.append("drafter piecewise")
    return total, ", ".join(what)
