"""The measured side of a doctor run, read from bench's ``RunResult``: the decode step.

The client's per-stream rate (with its CI across repeats) is the default decode rate. When the
engine reports its own inter-token latency (bench's ``server_metrics``, from ``/metrics``) and
the two disagree by more than ``CLIENT_AGREEMENT_PCT``, the engine's number is the decode step:
a starved client or frontend delivers tokens in bursts, and then the client's timing describes
the delivery, not the step (docs/causes/frontend-bound.md).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ceiling.bench.results import LevelResult, RunResult
from ceiling.diagnose.hypotheses import CLIENT_AGREEMENT_PCT
from ceiling.diagnose.schema import Measured


class ServerQuantity(BaseModel):
    """One latency quantity of ``server_metrics``: the engine's mean beside the client's."""

    model_config = ConfigDict(extra="ignore")

    metric: str | None = None
    count: float | None = None
    server_mean_ms: float | None = None
    client_mean_ms: float | None = None
    overhead_ms: float | None = None


class ServerCounter(BaseModel):
    model_config = ConfigDict(extra="ignore")

    metric: str | None = None
    delta: float = 0.0


class ServerView(BaseModel):
    """bench's ``server_metrics`` of one level (``/metrics`` deltas over the run), typed."""

    model_config = ConfigDict(extra="ignore")

    available: bool = False
    reason: str | None = None
    engine: str | None = None
    quantities: dict[str, ServerQuantity] = Field(default_factory=dict)
    counters: dict[str, ServerCounter] = Field(default_factory=dict)

    @classmethod
    def of(cls, run: LevelResult | None) -> ServerView:
        return cls.model_validate(run.server_metrics or {}) if run is not None else cls()

    def quantity(self, name: str) -> ServerQuantity:
        return self.quantities.get(name) or ServerQuantity()

    def counter(self, name: str) -> ServerCounter:
        return self.counters.get(name) or ServerCounter()


def counted_itl(view: ServerView) -> ServerQuantity:
    """The engine's time per generated token from counters, for an engine that keeps no
    latency histogram (llama-server: tokens_predicted_seconds / tokens_predicted)."""
    secs, toks = view.counter("decode_seconds"), view.counter("generated_tokens")
    if not (secs.metric and toks.metric and toks.delta > 0 and secs.delta > 0):
        return ServerQuantity()
    return ServerQuantity(
        metric=f"{secs.metric} / {toks.metric}",
        count=toks.delta,
        server_mean_ms=secs.delta / toks.delta * 1000.0,
    )


def counted_acceptance(view: ServerView) -> tuple[float, str] | None:
    """Speculative decoding's mean acceptance length over the run from the engine's counters
    (bonus token included: 1 + accepted / drafts, vLLM's own definition in
    v1/spec_decode/metrics.py) and the evidence line; None without drafts in the run."""
    drafts, accepted = view.counter("spec_drafts"), view.counter("spec_accepted_tokens")
    if not (drafts.metric and accepted.metric and drafts.delta > 0):
        return None
    tau = 1.0 + accepted.delta / drafts.delta
    drafted = view.counter("spec_draft_tokens")
    rate = f", {accepted.delta / drafted.delta:.1%} of drafted" if drafted.delta > 0 else ""
    return tau, (
        f"acceptance length {tau:.3f} over the measured run: 1 + {accepted.delta:g} accepted "
        f"/ {drafts.delta:g} drafts{rate} ({accepted.metric}, {drafts.metric})"
    )


def decode_stat(run: LevelResult | None) -> tuple[float | None, float | None, float | None]:
    """Decode tok/s per stream with its CI across repeats: (mean, low, high)."""
    if run is None:
        return None, None, None
    ci = run.ci.get("decode_tok_s_per_stream")
    if ci is not None and ci.mean is not None:
        return ci.mean, ci.low, ci.high
    return run.decode_tok_s_per_stream, None, None


def levels(run: RunResult | None) -> list[LevelResult]:
    """The levels of a concurrency sweep that have a concurrency, sorted by it."""
    if run is None:
        return []
    return sorted((lv for lv in run.levels if lv.concurrency), key=lambda lv: lv.concurrency or 0)


def measured_step(run: LevelResult | None) -> Measured | None:
    """The decode step of a bench result (or one level of it), and where it comes from."""
    if run is None:
        return None
    mean, lo, hi = decode_stat(run)
    if mean is None and run.mean_tpot_ms:
        mean = 1000.0 / run.mean_tpot_ms
    view = ServerView.of(run)
    itl = view.quantity("itl")
    srv = itl.server_mean_ms
    client_step = 1000.0 / mean if mean else None
    if srv is None:
        # counters time a whole slot's generation (sampling and the server's own work between
        # steps included): evidence of a starved client only when they say FASTER than it saw
        counted = counted_itl(view)
        if counted.server_mean_ms and client_step and counted.server_mean_ms < client_step:
            itl, srv = counted, counted.server_mean_ms
    if srv and (client_step is None or abs(client_step - srv) > CLIENT_AGREEMENT_PCT / 100 * srv):
        seen = (
            f"; the client's decode rate implies {client_step:.3g} ms per token"
            if client_step
            else ""
        )
        return Measured(
            step_ms=srv,
            tok_s=1000.0 / srv,
            source=(
                f"the engine's own inter-token latency ({itl.metric}, {int(itl.count or 0)} "
                f"tokens, /metrics){seen}: the client's timing is not the decode step here"
            ),
        )
    if client_step is None or mean is None:
        return None
    ci = (lo, hi) if lo is not None and hi is not None else None
    step_ci = (1000.0 / hi, 1000.0 / lo) if lo is not None and hi is not None and lo > 0 else None
    return Measured(
        step_ms=client_step,
        step_ci_ms=step_ci,
        tok_s=mean,
        tok_s_ci=ci,
        source="client-measured decode rate (ceiling bench, per stream)"
        + (f"; the engine's own inter-token latency agrees ({srv:.3g} ms)" if srv else ""),
    )
