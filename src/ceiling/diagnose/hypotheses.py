"""The usual hypotheses, answered with the evidence (the verdict's ``hypotheses``).

Each is a noun of its own (``kind`` tells which): the numbers that decide it are fields, the
answer a sentence rendered from them (:class:`~ceiling.result_model.ResultModel`). ``verdict.py``
decides which apply and fills them; a hypothesis with no evidence either way is left out
rather than guessed.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, computed_field

from ceiling.diagnose.wording import HardwareKind, us_or_ms
from ceiling.result_model import ResultModel

# Allreduce messages below this size are latency-bound on any interconnect (alpha >> bytes/beta
# for PCIe and NVLink alike; see docs/causes/custom-allreduce-off.md).
LATENCY_BOUND_BYTES = 64 * 1024
# Client and engine per-token latencies within this much are "the same measurement".
CLIENT_AGREEMENT_PCT = 10.0


class _Hypothesis(ResultModel):
    predicted_gain_pct: float | None = None


class NcclHypothesis(_Hypothesis):
    """NCCL tuning: not applicable without an allreduce; else the gain it could buy at most.

    ``basis``: ``what-if`` (predict modelled a protocol/algorithm change), ``bandwidth`` (the
    bandwidth part of the step's allreduces: all NCCL settings can move), ``collectives`` (the
    whole collective time: an upper bound), ``not-applicable``.
    """

    kind: Literal["nccl"] = "nccl"
    basis: Literal["not-applicable", "what-if", "bandwidth", "collectives"]
    hardware_kind: HardwareKind = "gpu"
    change: str | None = Field(None, description="the what-if change (basis what-if)")
    allreduces_per_step: int | None = None
    bandwidth_ms: float | None = None
    step_ms: float | None = None
    collectives_ms: float | None = None
    message_bytes: int | None = Field(None, description="bytes per decode allreduce call")
    other_change: str | None = Field(None, description="another allreduce implementation")
    other_gain_pct: float | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hypothesis(self) -> str:
        return "NCCL algorithm/protocol tuning (NCCL_ALGO, NCCL_PROTO, channels, buffer size)"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def latency_bound(self) -> bool:
        return self.message_bytes is not None and self.message_bytes < LATENCY_BOUND_BYTES

    @computed_field  # type: ignore[prop-decorator]
    @property
    def answer(self) -> str:
        gain = self.predicted_gain_pct or 0.0
        if self.basis == "not-applicable":
            where = "one CPU process" if self.hardware_kind == "cpu" else "TP=1"
            return f"not applicable: {where}, the decode step has no allreduce."
        if self.basis == "what-if":
            ans = f"predicted {gain:+.2g} % ({self.change})"
        elif self.basis == "bandwidth":
            ans = (
                f"predicted <= {gain:.2g} %: the bandwidth part of {self.allreduces_per_step} "
                f"allreduces per step is {us_or_ms(self.bandwidth_ms or 0.0)} of the "
                f"{us_or_ms(self.step_ms or 0.0)} step"
            )
        else:
            ans = f"predicted <= {gain:.2g} % even if the allreduce cost vanished"
        if self.latency_bound and self.message_bytes is not None:
            ans += (
                f"; allreduce here is latency-bound at {self.message_bytes / 1024:.3g} KB per "
                "call, so protocol, channel and buffer settings move bandwidth that is not the "
                "limit"
            )
        if self.other_change and self.other_gain_pct is not None:
            ans += (
                f" (a different implementation is another matter: {self.other_change}: "
                f"predicted {self.other_gain_pct:+.3g} %)"
            )
        return ans

    @computed_field  # type: ignore[prop-decorator]
    @property
    def evidence(self) -> str | None:
        if self.collectives_ms is None or self.step_ms is None:
            return None
        return f"collectives {us_or_ms(self.collectives_ms)} of {us_or_ms(self.step_ms)} per step"


class FlagHypothesis(_Hypothesis):
    """A flag people try first, checked against the installed engine before any load."""

    kind: Literal["flag"] = "flag"
    flag: str
    rejected: str | None = Field(None, description="why the installed engine refuses it")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hypothesis(self) -> str:
        return f"`{self.flag}`"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def answer(self) -> str:
        if self.rejected:
            return f"not in the installed engine: {self.rejected}"
        return "accepted by the installed engine (no prediction of its effect)"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def evidence(self) -> str | None:
        return "preflight against the installed engine, before any load" if self.rejected else None


class MemoryHypothesis(_Hypothesis):
    """Faster memory: at most the share of the step the weight and KV reads take."""

    kind: Literal["memory"] = "memory"
    memory_ms: float
    step_ms: float
    floors_detail: str | None = Field(None, description="e.g. '1.7 MB of weights at 9.8 GB/s'")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hypothesis(self) -> str:
        return "Faster memory / more memory bandwidth"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def answer(self) -> str:
        detail = f" ({self.floors_detail})" if self.floors_detail else ""
        return (
            f"predicted <= {self.predicted_gain_pct or 0.0:.2g} %: weight and KV reads take "
            f"{us_or_ms(self.memory_ms)} of the {us_or_ms(self.step_ms)} step{detail}"
        )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def evidence(self) -> str | None:
        return None


class GraphHypothesis(_Hypothesis):
    """CUDA graphs: what predict's what-if says turning them on (or off) does."""

    kind: Literal["cuda-graphs"] = "cuda-graphs"
    hardware_kind: HardwareKind = "gpu"
    change: str | None = None
    delta_pct: float | None = Field(None, description="the what-if's expected change")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hypothesis(self) -> str:
        return "CUDA graphs / torch.compile" if self.hardware_kind == "cpu" else "CUDA graphs"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def already_on(self) -> bool:
        return self.delta_pct is not None and self.delta_pct < 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def answer(self) -> str:
        if self.hardware_kind == "cpu":
            return (
                "no CUDA graphs on CPU; the per-operator dispatch cost they would hide on a "
                "GPU is part of the measured host overhead here"
            )
        d = self.delta_pct or 0.0
        if self.already_on:
            return f"already on; turning them off is predicted to cost {-d:.3g} %"
        return f"predicted {d:+.3g} % ({self.change})"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def evidence(self) -> str | None:
        return None


class StreamsHypothesis(_Hypothesis):
    """More concurrent streams, from the measured concurrency sweep (or: not served)."""

    kind: Literal["streams"] = "streams"
    from_concurrency: int
    to_concurrency: int
    failed: int = Field(0, description="failed requests at to_concurrency (not served)")
    completed: int | None = None
    errors: dict[str, int] = Field(default_factory=dict)
    step_growth_pct: float | None = None
    output_gain_pct: float | None = Field(None, description="end-to-end output tok/s change")
    unexplained_per_token_ms: tuple[float, float] | None = Field(
        None, description="(at from_concurrency, at to_concurrency)"
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hypothesis(self) -> str:
        if self.failed:
            return f"More concurrent streams (-> {self.to_concurrency})"
        return f"More concurrent streams ({self.from_concurrency} -> {self.to_concurrency})"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def overhead_shared(self) -> bool | None:
        """The unexplained time per token fell: the overhead is per step, shared by the batch."""
        u = self.unexplained_per_token_ms
        return None if u is None else u[1] < u[0]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def answer(self) -> str:
        c = self.to_concurrency
        if self.failed:
            total = self.failed + (self.completed or 0)
            kinds = ", ".join(f"{k} {v}" for k, v in self.errors.items()) or "errors"
            return (
                f"not served: at concurrency {c}, {self.failed} of {total} requests failed "
                f"({kinds}); the server did not serve {c} streams at once, so no throughput "
                "gain can be claimed from that level"
            )
        u = self.unexplained_per_token_ms or (0.0, 0.0)
        shared = (
            "so the per-step overhead is shared"
            if self.overhead_shared
            else "so the overhead grows with the batch: it is not per-step"
        )
        e2e = (
            f"; end-to-end output tok/s (prefill and TTFT included) {self.output_gain_pct:+.3g} %"
            if self.output_gain_pct is not None
            else ""
        )
        return (
            f"measured {self.predicted_gain_pct or 0.0:+.3g} % total decode tok/s; the step grew "
            f"{self.step_growth_pct or 0.0:+.3g} % while serving "
            f"{c // max(self.from_concurrency, 1)}x the tokens, {shared} "
            f"({us_or_ms(u[0])} -> {us_or_ms(u[1])} unexplained per token){e2e}"
        )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def evidence(self) -> str | None:
        if self.failed:
            return "measured concurrency sweep (failed requests per level)"
        return "measured concurrency sweep (decode rate = streams x 1000 / mean TPOT)"


class ClientHypothesis(_Hypothesis):
    """H1: is the slowness in the client or the measurement rather than in the server?"""

    kind: Literal["client"] = "client"
    server_itl_ms: float
    client_itl_ms: float

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hypothesis(self) -> str:
        return "The client or the measurement, not the server, is slow"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def difference_pct(self) -> float:
        return 100.0 * (self.client_itl_ms - self.server_itl_ms) / self.server_itl_ms

    @computed_field  # type: ignore[prop-decorator]
    @property
    def outcome(self) -> Literal["agree", "client-slower", "bursts"]:
        d = self.difference_pct
        if abs(d) <= CLIENT_AGREEMENT_PCT:
            return "agree"
        return "client-slower" if d > 0 else "bursts"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def answer(self) -> str:
        srv, cli, d = self.server_itl_ms, self.client_itl_ms, self.difference_pct
        if self.outcome == "agree":
            return (
                f"no: the engine's own inter-token latency ({srv:.3g} ms, from /metrics) agrees "
                f"with the client's ({cli:.3g} ms, {d:+.2g} %)"
            )
        if self.outcome == "client-slower":
            return (
                f"partly: the client sees {cli:.3g} ms per token, the engine reports {srv:.3g} "
                f"ms ({d:+.2g} %): streaming, detokenization or the client add the difference"
            )
        return (
            f"the client's timing is unreliable here: it saw {cli:.3g} ms per token, the engine "
            f"reports {srv:.3g} ms ({d:+.2g} %): tokens reach the client in bursts (a starved "
            "API frontend or client), so the attribution uses the engine's number"
        )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def evidence(self) -> str | None:
        return "bench server_metrics (vllm:inter_token_latency_seconds)"


Hypothesis = Annotated[
    NcclHypothesis
    | FlagHypothesis
    | MemoryHypothesis
    | GraphHypothesis
    | StreamsHypothesis
    | ClientHypothesis,
    Field(discriminator="kind"),
]
