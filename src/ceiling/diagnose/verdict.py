"""The verdict: what the deployment does, what it is expected to do, and where the gap goes.

Why a separate module: the verdict is the part people act on, so every statement in it must
be traceable to a number (a measurement, a prediction, a log line). It takes the attribution,
the prediction, the engine's findings and the preflight answers, and decides the numbers: the
measured rate with its CI, the rate expected for this exact configuration and the layout's
bound, the best configuration predict expects on this hardware, the gap split into fundamental
/ configurable / unexplained (by the engine's own split where it has one: a trace, a
bandwidth split), the configurable changes ranked by gain, and answers to the
hypotheses people usually try first (NCCL tuning, multi-step scheduling, faster memory, CUDA
graphs, more streams). Hypotheses with no evidence either way are left out rather than guessed.
The sentences are rendered from those numbers by the nouns (``verdict_model.py``).

A change predict expects to help but whose configuration does not fit in memory (weights + KV
at this batch and context) is neither listed nor picked as the best configuration: it could
not be deployed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from ceiling.diagnose.attribute import Attribution, LevelAttribution
from ceiling.diagnose.closed_loop import ClosedLoopCapacity
from ceiling.diagnose.finding_types import Finding
from ceiling.diagnose.hypotheses import (
    ClientHypothesis,
    FlagHypothesis,
    GraphHypothesis,
    Hypothesis,
    MemoryHypothesis,
    NcclHypothesis,
    StreamsHypothesis,
)
from ceiling.diagnose.verdict_model import (
    BestConfig,
    Bottleneck,
    Change,
    CpuReadNote,
    Gap,
    TargetCheck,
    Verdict,
)
from ceiling.diagnose.wording import clip
from ceiling.gap_schema import BandwidthGap
from ceiling.predict.schema import Prediction, WhatIf
from ceiling.predict.slack import split_slack
from ceiling.sanity.report import SanityReport
from ceiling.trace.schema import MeasuredSplit

# Above this share of the step, the unexplained remainder is what bounds the deployment.
HOST_BOUND_SHARE_PCT = 50.0
# When the measured step is this much shorter than predicted, the split is not to be trusted.
OVERESTIMATE_SHARE_PCT = 20.0


class VerdictInputs(BaseModel):
    """Everything the verdict may draw on; each piece is optional."""

    attribution: Attribution | None = None
    measured_tok_s: float | None = None
    measured_ci: tuple[float, float] | None = None
    prediction: Prediction | None = None
    prediction_note: str | None = None
    hardware_kind: str = "gpu"
    link_bw_GBps: float | None = Field(None, description="per-direction link bandwidth")
    findings: list[Finding] = Field(default_factory=list)
    flag_checks: dict[str, str | None] = Field(
        default_factory=dict,
        description="flag -> why the installed engine rejects it (None: accepted), from preflight",
    )
    levels: list[LevelAttribution] = Field(default_factory=list)
    server_itl_ms: float | None = Field(None, description="engine's own mean ITL (/metrics)")
    client_itl_ms: float | None = None
    target_tok_s: float | None = None
    floors_detail: str | None = Field(None, description="e.g. '1.7 MB of weights at 9.8 GB/s'")
    server_death: str | None = None
    cpu_read: CpuReadNote | None = None
    measured_split: MeasuredSplit | None = Field(
        None, description="the engine's own split of the step (a trace): the verdict's basis"
    )
    bandwidth: BandwidthGap | None = Field(
        None, description="the engine's bandwidth split of the one-stream step: the gap's basis"
    )
    capacity: ClosedLoopCapacity | None = Field(
        None, description="--slo: the concurrency levels judged against the SLOs"
    )

    @property
    def kind(self) -> str:
        return "cpu" if self.hardware_kind == "cpu" else "gpu"


def runnable_what_ifs(pred: Prediction | None) -> list[WhatIf]:
    """The what-if variants that can be deployed: they run, and weights + KV fit in memory."""
    if pred is None:
        return []
    return [w for w in pred.what_if if w.fits_in_memory and w.decode_tok_s_per_stream > 0]


def bottleneck(inp: VerdictInputs) -> Bottleneck:
    a, kind = inp.attribution, inp.kind
    ms = inp.measured_split
    largest = ms.largest() if ms is not None else None
    if ms is not None and largest is not None:
        # a trace: the headline is the engine's own split, never predict's forecast of it
        return Bottleneck(
            case="measured",
            hardware_kind=kind,
            step_ms=ms.step_ms,
            predicted_step_ms=a.predicted_step_ms if a is not None else None,
            floors_ms=ms.fundamental_ms,
            configurable_ms=ms.configurable_ms,
            unbounded_ms=ms.unbounded_ms,
            component=largest.op_class,
            component_ms=largest.measured_ms,
            component_share_pct=largest.share_pct,
            measured_component=largest.component,
            measured_tok_s=inp.measured_tok_s,
        )
    if a is None:
        if inp.measured_tok_s is None:
            return Bottleneck(case="no-measurement", hardware_kind=kind)
        return Bottleneck(
            case="no-prediction", hardware_kind=kind, measured_tok_s=inp.measured_tok_s
        )
    base = Bottleneck(
        case="component",
        hardware_kind=kind,
        step_ms=a.measured_step_ms,
        predicted_step_ms=a.predicted_step_ms,
        floors_ms=sum(c.predicted_ms for c in a.components if c.kind == "fundamental"),
        unexplained_pct=a.unexplained_pct,
        measured_tok_s=inp.measured_tok_s,
    )
    if a.unexplained_pct >= HOST_BOUND_SHARE_PCT:
        return base.model_copy(update={"case": "host-bound"})
    top = max(a.components, key=lambda c: c.predicted_ms, default=None)
    if top is None:
        return base.model_copy(update={"component": "unknown", "component_share_pct": 0.0})
    update = {
        "component": top.name,
        "component_ms": top.predicted_ms,
        "component_share_pct": top.share_pct,
    }
    if a.unexplained_pct <= -OVERESTIMATE_SHARE_PCT:
        update["case"] = "overestimate"
        update.update(_contradicted_evidence(inp.prediction, a))
    return base.model_copy(update=update)


def _contradicted_evidence(pred: Prediction | None, a: Attribution) -> dict[str, Any]:
    """When one source of the prediction's evidence alone costs more beyond the floors than the
    measured step leaves (``predict.slack``), name it and its largest op: that evidence does not
    describe the kernels this engine ran, whatever the other ops cost."""
    if pred is None or pred.batch != a.batch:
        return {}
    split = split_slack(pred, a.measured_step_ms)
    if split is None or not split.contradicted:
        return {}
    source = max(split.contradicted, key=lambda s: split.excess_ms_by_source[s])
    op = next((o for o in split.top_ops if o[1] == source), None)
    return {
        "evidence_source": source,
        "evidence_excess_ms": split.excess_ms_by_source[source],
        "slack_ms": split.slack_ms,
        "evidence_op": op[0] if op else None,
        "evidence_op_ms": op[2] if op else None,
    }


def _nccl_hypothesis(inp: VerdictInputs, a: Attribution | None) -> NcclHypothesis | None:
    if a is None:
        return None
    pred = inp.prediction
    tp = pred.deployment.tp if pred is not None else 1
    coll = next((c for c in a.components if c.name == "collectives"), None)
    if tp <= 1 and (coll is None or coll.predicted_ms == 0):
        return NcclHypothesis(
            basis="not-applicable", hardware_kind=inp.kind, predicted_gain_pct=0.0
        )
    if coll is None or pred is None:
        return None
    details = pred.details
    msg = details.allreduce_bytes
    if msg is None:  # the step's collective is not an allreduce: one hidden vector per token
        msg = pred.model.hidden_size * 2 * max(a.batch, 1)
    calls = details.allreduces
    common: dict[str, Any] = {
        "message_bytes": int(msg),
        "collectives_ms": coll.predicted_ms,
        "step_ms": a.measured_step_ms,
        "allreduces_per_step": int(calls) if calls else None,
    }
    wis = runnable_what_ifs(pred)
    other = [w for w in wis if "allreduce" in w.change.lower() and w.delta_pct > 0]
    if other:
        best_other = max(other, key=lambda w: w.delta_pct)
        common |= {"other_change": best_other.change, "other_gain_pct": best_other.delta_pct}
    tuning = [w for w in wis if any(k in w.change for k in ("NCCL_", "protocol", "algorithm"))]
    if tuning:
        best = max(tuning, key=lambda w: w.delta_pct)
        return NcclHypothesis(
            basis="what-if", change=best.change, predicted_gain_pct=best.delta_pct, **common
        )
    if calls and inp.link_bw_GBps:
        # A ring allreduce moves ~2x the message over the link; NCCL's protocol, channel and
        # buffer settings change how fast those bytes move, not the per-hop latency.
        bw_ms = calls * 2.0 * msg / (inp.link_bw_GBps * 1e9) * 1e3
        return NcclHypothesis(
            basis="bandwidth",
            bandwidth_ms=bw_ms,
            predicted_gain_pct=100.0 * bw_ms / a.measured_step_ms,
            **common,
        )
    return NcclHypothesis(basis="collectives", predicted_gain_pct=coll.share_pct, **common)


def _flag_hypotheses(inp: VerdictInputs) -> list[FlagHypothesis]:
    return [
        FlagHypothesis(flag=flag, rejected=why, predicted_gain_pct=0.0 if why else None)
        for flag, why in inp.flag_checks.items()
    ]


def _memory_hypothesis(inp: VerdictInputs, a: Attribution | None) -> MemoryHypothesis | None:
    if a is None:
        return None
    mem = sum(c.predicted_ms for c in a.components if c.name in ("weights", "kv"))
    if mem <= 0:
        return None
    return MemoryHypothesis(
        memory_ms=mem,
        step_ms=a.measured_step_ms,
        floors_detail=inp.floors_detail,
        predicted_gain_pct=100.0 * mem / a.measured_step_ms,
    )


def _graph_hypothesis(inp: VerdictInputs) -> GraphHypothesis | None:
    if inp.kind == "cpu":
        return GraphHypothesis(hardware_kind="cpu")
    wi = [w for w in runnable_what_ifs(inp.prediction) if "graph" in w.change.lower()]
    if not wi:
        return None
    w = max(wi, key=lambda w: w.delta_pct)
    return GraphHypothesis(
        change=w.change, delta_pct=w.delta_pct, predicted_gain_pct=max(w.delta_pct, 0.0)
    )


def served(levels: Sequence[LevelAttribution]) -> list[LevelAttribution]:
    """Levels whose requests all completed: only those say anything about batching."""
    return [lv for lv in levels if not lv.failed]


def _gain_pct(lo: LevelAttribution, hi: LevelAttribution) -> float:
    return 100.0 * (hi.decode_tok_s_total / lo.decode_tok_s_total - 1.0)


def best_level(levels: Sequence[LevelAttribution]) -> LevelAttribution:
    """The served level with the highest total decode rate (ties: the fewer streams). Not the
    last level: past the engine's knee more streams serve less (the demo: 2 streams ~50 %
    above 4), and recommending the last one would advise the worse setting."""
    return max(levels, key=lambda lv: (lv.decode_tok_s_total, -lv.concurrency))


def _streams_hypothesis(levels: Sequence[LevelAttribution]) -> StreamsHypothesis | None:
    broken = [lv for lv in levels if lv.failed]
    if broken:
        b = broken[0]
        first = levels[0].concurrency if levels else b.concurrency
        return StreamsHypothesis(
            from_concurrency=first,
            to_concurrency=b.concurrency,
            failed=b.failed,
            completed=b.completed,
            errors=b.errors,
        )
    ok = served(levels)
    if len(ok) < 2:
        return None
    lo, hi = ok[0], best_level(ok)
    if hi is lo:  # more streams never served more: compare with the last level measured
        hi = ok[-1]
    e2e = None
    if lo.output_tok_s and hi.output_tok_s:
        e2e = 100.0 * (hi.output_tok_s / lo.output_tok_s - 1.0)
    return StreamsHypothesis(
        from_concurrency=lo.concurrency,
        to_concurrency=hi.concurrency,
        predicted_gain_pct=_gain_pct(lo, hi),
        step_growth_pct=100.0 * (hi.measured_step_ms / lo.measured_step_ms - 1.0),
        output_gain_pct=e2e,
        unexplained_per_token_ms=(lo.unexplained_per_token_ms, hi.unexplained_per_token_ms),
    )


def _client_hypothesis(inp: VerdictInputs) -> ClientHypothesis | None:
    if not inp.server_itl_ms or not inp.client_itl_ms:
        return None
    return ClientHypothesis(server_itl_ms=inp.server_itl_ms, client_itl_ms=inp.client_itl_ms)


def _finding_change(f: Finding) -> Change | None:
    if f.kind != "configurable" or not f.fix or f.severity == "info":
        return None
    ev = "; ".join(clip(str(x)) for x in f.evidence[:2]) or None
    return Change(
        kind="finding",
        change=f.fix,
        source=f"finding {f.id}",
        quote=f"{f.title}: {f.predicted_effect or ''}" + (f" [{ev}]" if ev else ""),
    )


def changes(inp: VerdictInputs) -> list[Change]:
    """Configurable changes, ranked by gain: predict's what-ifs that help and fit, the log's
    configurable findings with advice, and more streams when the sweep measured a gain."""
    out: list[Change] = []
    pred = inp.prediction
    base = pred.expected_tok_s if pred is not None else None
    for w in runnable_what_ifs(pred):
        if w.delta_pct <= 0:
            continue
        out.append(
            Change(
                kind="what-if",
                change=w.change,
                source="predict what-if",
                predicted_gain_pct=w.delta_pct,
                predicted_tok_s=w.decode_tok_s_per_stream,
                base_tok_s=base,
                bound_tok_s=w.bound_tok_s_per_stream or None,
            )
        )
    out += [c for c in map(_finding_change, inp.findings) if c is not None]
    lv = served(inp.levels)
    best = best_level(lv) if lv else None
    if len(lv) >= 2 and best is not None and _gain_pct(lv[0], best) > 0:
        out.append(
            Change(
                kind="measured",
                change=f"serve {best.concurrency} streams at once (total throughput, not "
                "per-stream speed)",
                source="measured (concurrency sweep)",
                predicted_gain_pct=_gain_pct(lv[0], best),
                predicted_tok_s=best.decode_tok_s_total,
                from_tok_s=lv[0].decode_tok_s_total,
                from_concurrency=lv[0].concurrency,
                to_concurrency=best.concurrency,
            )
        )
    out.sort(key=lambda c: -(c.predicted_gain_pct if c.predicted_gain_pct is not None else -1e9))
    return out


def best_config(pred: Prediction | None) -> BestConfig | None:
    """The fastest deployable one-knob variant, when it beats this configuration."""
    wis = runnable_what_ifs(pred)
    if pred is None or not wis:
        return None
    top = max(wis, key=lambda w: w.decode_tok_s_per_stream)
    base = pred.expected_tok_s
    if base is not None and top.decode_tok_s_per_stream <= base:
        return None
    return BestConfig(change=top.change, tok_s=top.decode_tok_s_per_stream)


def target_check(inp: VerdictInputs, best: BestConfig | None) -> TargetCheck | None:
    if inp.target_tok_s is None or inp.measured_tok_s is None:
        return None
    pred = inp.prediction
    reach = best is not None and best.tok_s >= inp.target_tok_s
    return TargetCheck(
        target_tok_s=inp.target_tok_s,
        measured_tok_s=inp.measured_tok_s,
        ci_low=inp.measured_ci[0] if inp.measured_ci else None,
        ci_high=inp.measured_ci[1] if inp.measured_ci else None,
        expected_tok_s=pred.expected_tok_s if pred is not None else None,
        bound_tok_s=pred.bound_tok_s if pred is not None else None,
        best_change=best.change if best is not None and reach else None,
        best_tok_s=best.tok_s if best is not None and reach else None,
    )


def _pct(a: float | None, b: float | None) -> float | None:
    return 100.0 * a / b if a and b else None


def build_verdict(inp: VerdictInputs) -> Verdict:
    """Assemble the verdict from whatever evidence exists."""
    a, pred = inp.attribution, inp.prediction
    expected = pred.expected_tok_s if pred is not None else None
    bound = pred.bound_tok_s if pred is not None else None
    hyps: list[Hypothesis | None] = [
        _nccl_hypothesis(inp, a),
        *_flag_hypotheses(inp),
        _memory_hypothesis(inp, a),
        _graph_hypothesis(inp),
        _streams_hypothesis(inp.levels),
        _client_hypothesis(inp),
    ]
    best = best_config(pred)
    gap = None
    ms = inp.measured_split
    if ms is not None:
        gap = Gap(
            fundamental_ms=ms.fundamental_ms,
            configurable_ms=ms.configurable_ms,
            unexplained_ms=ms.unbounded_ms,
            measured_ms=ms.step_ms,
        )
    elif inp.bandwidth is not None:  # the engine's own split of the measured step
        gap = Gap.of_bandwidth(inp.bandwidth)
    elif a is not None:
        gap = Gap(
            fundamental_ms=a.fundamental_ms,
            configurable_ms=a.configurable_ms,
            unexplained_ms=a.unexplained_ms,
            measured_ms=a.measured_step_ms,
        )
    return Verdict(
        bottleneck=bottleneck(inp),
        measured_tok_s=inp.measured_tok_s,
        measured_ci_low=inp.measured_ci[0] if inp.measured_ci else None,
        measured_ci_high=inp.measured_ci[1] if inp.measured_ci else None,
        predicted_tok_s=expected,
        bound_tok_s=bound,
        prediction_note=inp.prediction_note,
        pct_of_predicted=_pct(inp.measured_tok_s, expected),
        pct_of_bound=_pct(inp.measured_tok_s, bound),
        expected_pct_of_bound=_pct(expected, bound),
        best_config=best,
        gap=gap,
        changes=changes(inp),
        hypotheses=[h for h in hyps if h is not None],
        target=target_check(inp, best),
        server_death=inp.server_death,
        cpu_read=inp.cpu_read,
        measured=ms,
        capacity=inp.capacity,
    )


def broken_output_verdict(report: SanityReport) -> Verdict:
    """The verdict of a run the sanity gate stopped (nothing was benchmarked)."""
    return Verdict(bottleneck=Bottleneck(case="broken-output", broken=report.headline))
