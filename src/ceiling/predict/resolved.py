"""``Setup``: everything resolved for one prediction (model, box, layout, constants).

Its own module so that every part of the step model (``ops``, ``evidence``, ``comm``,
``choices``, ``overlap``, ``step``) names the one type without importing each other;
``core.setup`` builds it from a ``PredictRequest``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ceiling.predict.datafiles import Constants
from ceiling.spec.deployment import Deployment, EngineRules
from ceiling.spec.hardware import GPU, Link
from ceiling.spec.model import ModelSpec
from ceiling.spec.profile import HardwareProfile


@dataclass
class Setup:
    """Everything resolved for one prediction (model, box, layout, constants)."""

    spec: ModelSpec
    gpu: GPU
    link: Link
    dep: Deployment
    rules: EngineRules
    consts: Constants
    profile: HardwareProfile | None
    allreduce_impl: str
    allreduce_reason: str
    kv_bytes: float
    kv_reason: str
    bw_GBps: float
    bw_reason: str
    # the user's engine choices (None: the engine's default for this GPU and model)
    attention_backend: str | None = None
    moe_backend: str | None = None
    async_scheduling: bool | None = None
    # the speculative method of the step being priced (None: plain decode); engines that
    # change their scheduler for it say so in engines.yaml (overlap_off: speculative)
    speculative: str | None = None

    @property
    def expert_tp(self) -> int:
        """How many ways each routed expert is split (TP when EP=1; EP ranks hold whole experts)."""
        d = self.dep
        if d.ep <= 1:
            return d.tp
        return max(1, (d.tp * d.dp) // d.ep)

    @property
    def small_kernel_us(self) -> float:
        """GPU cost of one non-GEMM kernel in a CUDA graph (profile's launch figure if any)."""
        p = self.profile
        if p and p.kernel_launch_us_graph:
            return p.kernel_launch_us_graph
        return self.consts.small_kernel_us_graph

    @property
    def gemm_kernel_us(self) -> float:
        """Fixed GPU cost of one weight-reading GEMM kernel, on top of bytes / bandwidth."""
        p = self.profile
        if p and p.gemm_fixed_us_graph:
            return p.gemm_fixed_us_graph
        return self.consts.gemm_kernel_us_graph

    @property
    def eager_kernel_us(self) -> float:
        """CPU cost of issuing one kernel eagerly."""
        # calibrate times a bare op (t.add_) issued in a loop: the floor of the eager
        # per-kernel cost. A real eager decode step also runs module code per kernel (the
        # constant is measured on one: 19 us per kernel on an H200 host), so the larger of
        # the two governs; a slow host shows up through the profile's figure.
        const = self.consts.kernel_us_eager
        p = self.profile
        if p and p.kernel_launch_us_eager:
            return max(p.kernel_launch_us_eager, const)
        return const

    def kernel_ms(self, kernels: tuple[int, int]) -> float:
        """GPU time of (gemm, other) kernel boundaries in a CUDA graph, milliseconds."""
        gemm, other = kernels
        return (gemm * self.gemm_kernel_us + other * self.small_kernel_us) / 1e3
