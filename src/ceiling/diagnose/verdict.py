"""The verdict: what the deployment does, what it could do, and where the difference goes.

Why a separate module: the verdict is the part people act on, so every sentence it writes must
be traceable to a number (a measurement, a prediction, a log line). It takes the attribution,
the prediction, the engine's findings and the preflight answers, and produces plain statements:
the measured rate with its CI, the predicted ceiling for this exact configuration, the best
predicted configuration on this hardware, the gap split into fundamental / configurable /
unexplained, the configurable changes ranked by predicted gain, and answers to the hypotheses
people usually try first (NCCL tuning, multi-step scheduling, faster memory, CUDA graphs,
more streams). Hypotheses with no evidence either way are left out rather than guessed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from ceiling.diagnose.attribute import UNEXPLAINED_LABEL, Attribution, LevelAttribution

# Above this share of the step, the unexplained remainder is what bounds the deployment.
HOST_BOUND_SHARE_PCT = 50.0
# When the measured step is this much shorter than predicted, the split is not to be trusted.
OVERESTIMATE_SHARE_PCT = 20.0
# Allreduce messages below this size are latency-bound on any interconnect (alpha >> bytes/beta
# for PCIe and NVLink alike; see throughput-killers.md §2).
LATENCY_BOUND_BYTES = 64 * 1024
# Client and engine per-token latencies within this much are "the same measurement".
CLIENT_AGREEMENT_PCT = 10.0


class Hypothesis(BaseModel):
    """A usual suspect and the evidence-based answer."""

    hypothesis: str
    answer: str
    predicted_gain_pct: float | None = None
    evidence: str | None = None


class Change(BaseModel):
    """A configurable change with its predicted (or measured) gain."""

    change: str
    predicted_gain_pct: float | None = None
    predicted_tok_s: float | None = None
    source: str
    evidence: str | None = None


class TargetCheck(BaseModel):
    target_tok_s: float
    measured_tok_s: float
    met: bool
    margin_pct: float
    text: str


class Verdict(BaseModel):
    headline: str
    bound_by: str
    measured_tok_s: float | None
    measured_ci_low: float | None = None
    measured_ci_high: float | None = None
    predicted_tok_s: float | None = None
    prediction_note: str | None = None
    pct_of_predicted: float | None = None
    best_config: dict[str, Any] | None = None
    gap: dict[str, float] = Field(default_factory=dict)
    changes: list[Change] = Field(default_factory=list)
    hypotheses: list[Hypothesis] = Field(default_factory=list)
    target: TargetCheck | None = None
    notes: list[str] = Field(default_factory=list)


class VerdictInputs(BaseModel):
    """Everything the verdict may draw on; each piece is optional."""

    attribution: Attribution | None = None
    measured_tok_s: float | None = None
    measured_ci: tuple[float, float] | None = None
    prediction: dict[str, Any] | None = None
    prediction_note: str | None = None
    hardware_kind: str = "gpu"
    tp: int = 1
    hidden_size: int | None = None
    activation_bytes: int = 2
    allreduce_bytes: int | None = Field(None, description="bytes per decode allreduce call")
    allreduces_per_step: int | None = None
    link_bw_GBps: float | None = Field(None, description="per-direction link bandwidth")
    findings: list[dict[str, Any]] = Field(default_factory=list)
    flag_checks: dict[str, str | None] = Field(
        default_factory=dict,
        description="flag -> why the installed engine rejects it (None: accepted), from preflight",
    )
    levels: list[LevelAttribution] = Field(default_factory=list)
    server_itl_ms: float | None = Field(None, description="engine's own mean ITL (/metrics)")
    client_itl_ms: float | None = None
    target_tok_s: float | None = None
    floors_detail: str | None = Field(None, description="e.g. '1.7 MB of weights at 9.8 GB/s'")


def _clip(text: str, limit: int = 160) -> str:
    """Log lines can be kilobytes long (vLLM's config line): keep the start."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _f(v: float, digits: int = 3) -> str:
    """Significant digits without scientific notation for the magnitudes a report shows
    (1,070 tok/s, not 1.07e+03)."""
    if abs(v) >= 10**digits:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def _us_or_ms(ms: float) -> str:
    return f"{ms * 1000:.3g} us" if abs(ms) < 1 else f"{ms:.3g} ms"


def _headline(inp: VerdictInputs, a: Attribution | None) -> tuple[str, str]:
    if a is None:
        if inp.measured_tok_s is None:
            return "No decode measurement: nothing to attribute.", "unknown"
        return (
            f"Measured {_f(inp.measured_tok_s)} tok/s per stream; no prediction to set it against.",
            "unknown",
        )
    step = a.measured_step_ms
    floors = sum(c.predicted_ms for c in a.components if c.kind == "fundamental")
    if a.unexplained_pct >= HOST_BOUND_SHARE_PCT:
        what = (
            "host / launch-overhead-bound, not bandwidth-bound"
            if inp.hardware_kind == "cpu"
            else "bound by kernel inefficiency / host overhead, not by the hardware floors"
        )
        return (
            f"{what[0].upper()}{what[1:]}: {a.unexplained_pct:.4g} % of the {_us_or_ms(step)} "
            f"decode step is {UNEXPLAINED_LABEL}; the hardware floors (weights, KV, compute) "
            f"account for {_us_or_ms(floors)}.",
            "host overhead" if inp.hardware_kind == "cpu" else UNEXPLAINED_LABEL,
        )
    top = max(a.components, key=lambda c: c.predicted_ms, default=None)
    if a.unexplained_pct <= -OVERESTIMATE_SHARE_PCT and top is not None:
        return (
            f"Faster than predicted: the measured step takes {_us_or_ms(step)} against a "
            f"predicted {_us_or_ms(a.predicted_step_ms)}; the largest predicted component, "
            f"{top.name} ({_us_or_ms(top.predicted_ms)}), is likely overestimated for this "
            "deployment: check the prediction's assumptions before trusting its split.",
            "prediction overestimates",
        )
    name = top.name if top else "unknown"
    label = {
        "weights": "memory-bandwidth-bound (weight reads)",
        "kv": "memory-bandwidth-bound (KV-cache reads)",
        "collectives": "collective-latency-bound",
        "launch": "kernel-launch-bound",
        "host": "host-bound",
        "compute": "compute-bound",
    }.get(name, f"bound by {name}")
    share = top.share_pct if top else 0.0
    return (
        f"{label[0].upper()}{label[1:]}: {name} is {share:.3g} % of the {_us_or_ms(step)} step; "
        f"{UNEXPLAINED_LABEL} is {a.unexplained_pct:.3g} %.",
        label,
    )


def _nccl_hypothesis(inp: VerdictInputs, a: Attribution | None) -> Hypothesis | None:
    name = "NCCL algorithm/protocol tuning (NCCL_ALGO, NCCL_PROTO, channels, buffer size)"
    if a is None:
        return None
    coll = next((c for c in a.components if c.name == "collectives"), None)
    if inp.tp <= 1 and (coll is None or coll.predicted_ms == 0):
        where = "one CPU process" if inp.hardware_kind == "cpu" else "TP=1"
        return Hypothesis(
            hypothesis=name,
            predicted_gain_pct=0.0,
            answer=f"not applicable: {where}, the decode step has no allreduce.",
        )
    if coll is None:
        return None
    msg = inp.allreduce_bytes
    if msg is None and inp.hidden_size:
        msg = inp.hidden_size * inp.activation_bytes * max(a.batch, 1)
    tuning = [
        w
        for w in (inp.prediction or {}).get("what_if") or []
        if any(k in str(w.get("change", "")) for k in ("NCCL_", "protocol", "algorithm"))
    ]
    calls = inp.allreduces_per_step
    if tuning:
        best = max(tuning, key=lambda w: w.get("delta_pct") or 0.0)
        gain = float(best.get("delta_pct") or 0.0)
        ans = f"predicted {gain:+.2g} % ({best.get('change')})"
    elif msg is not None and calls and inp.link_bw_GBps:
        # A ring allreduce moves ~2x the message over the link; NCCL's protocol, channel and
        # buffer settings change how fast those bytes move, not the per-hop latency.
        bw_ms = calls * 2.0 * msg / (inp.link_bw_GBps * 1e9) * 1e3
        gain = 100.0 * bw_ms / a.measured_step_ms
        ans = (
            f"predicted <= {gain:.2g} %: the bandwidth part of {calls} allreduces per step is "
            f"{_us_or_ms(bw_ms)} of the {_us_or_ms(a.measured_step_ms)} step"
        )
    else:
        gain = coll.share_pct
        ans = f"predicted <= {gain:.2g} % even if the allreduce cost vanished"
    if msg is not None and msg < LATENCY_BOUND_BYTES:
        ans += (
            f"; allreduce here is latency-bound at {msg / 1024:.3g} KB per call, so protocol, "
            "channel and buffer settings move bandwidth that is not the limit"
        )
    other = [
        w
        for w in (inp.prediction or {}).get("what_if") or []
        if "allreduce" in str(w.get("change", "")).lower() and (w.get("delta_pct") or 0) > 0
    ]
    if other:
        w = max(other, key=lambda w: w.get("delta_pct") or 0.0)
        ans += f" (a different implementation is another matter: {w['change']}: " + (
            f"predicted {float(w['delta_pct']):+.3g} %)"
        )
    return Hypothesis(
        hypothesis=name,
        answer=ans,
        predicted_gain_pct=gain,
        evidence=f"collectives {_us_or_ms(coll.predicted_ms)} of "
        f"{_us_or_ms(a.measured_step_ms)} per step",
    )


def _flag_hypotheses(inp: VerdictInputs) -> list[Hypothesis]:
    out = []
    for flag, why in inp.flag_checks.items():
        if why:
            out.append(
                Hypothesis(
                    hypothesis=f"`{flag}`",
                    answer=f"not in the installed engine: {why}",
                    predicted_gain_pct=0.0,
                    evidence="preflight against the installed engine, before any load",
                )
            )
        else:
            out.append(
                Hypothesis(
                    hypothesis=f"`{flag}`",
                    answer="accepted by the installed engine (no prediction of its effect)",
                )
            )
    return out


def _memory_hypothesis(inp: VerdictInputs, a: Attribution | None) -> Hypothesis | None:
    if a is None:
        return None
    mem = sum(c.predicted_ms for c in a.components if c.name in ("weights", "kv"))
    if mem <= 0:
        return None
    share = 100.0 * mem / a.measured_step_ms
    detail = f" ({inp.floors_detail})" if inp.floors_detail else ""
    return Hypothesis(
        hypothesis="Faster memory / more memory bandwidth",
        answer=(
            f"predicted <= {share:.2g} %: weight and KV reads take {_us_or_ms(mem)} of the "
            f"{_us_or_ms(a.measured_step_ms)} step{detail}"
        ),
        predicted_gain_pct=share,
    )


def _graph_hypothesis(inp: VerdictInputs, a: Attribution | None) -> Hypothesis | None:
    if inp.hardware_kind == "cpu":
        return Hypothesis(
            hypothesis="CUDA graphs / torch.compile",
            answer=(
                "no CUDA graphs on CPU; the per-operator dispatch cost they would hide on a "
                "GPU is part of the measured host overhead here"
            ),
        )
    wi = [
        w
        for w in (inp.prediction or {}).get("what_if") or []
        if "graph" in str(w.get("change", "")).lower()
    ]
    if wi:
        w = max(wi, key=lambda w: w.get("delta_pct") or 0.0)
        d = float(w.get("delta_pct") or 0.0)
        if d < 0:
            return Hypothesis(
                hypothesis="CUDA graphs",
                predicted_gain_pct=0.0,
                answer=f"already on; turning them off is predicted to cost {-d:.3g} %",
            )
        return Hypothesis(
            hypothesis="CUDA graphs",
            predicted_gain_pct=d,
            answer=f"predicted {d:+.3g} % ({w.get('change')})",
        )
    return None


def _served(levels: Sequence[LevelAttribution]) -> list[LevelAttribution]:
    """Levels whose requests all completed: only those say anything about batching."""
    return [lv for lv in levels if not lv.failed]


def _streams_hypothesis(levels: Sequence[LevelAttribution]) -> Hypothesis | None:
    broken = [lv for lv in levels if lv.failed]
    if broken:
        b = broken[0]
        total = b.failed + (b.completed or 0)
        kinds = ", ".join(f"{k} {v}" for k, v in b.errors.items()) or "errors"
        return Hypothesis(
            hypothesis=f"More concurrent streams (-> {b.concurrency})",
            answer=(
                f"not served: at concurrency {b.concurrency}, {b.failed} of {total} requests "
                f"failed ({kinds}); the server did not serve {b.concurrency} streams at once, "
                "so no throughput gain can be claimed from that level"
            ),
            evidence="measured concurrency sweep (failed requests per level)",
        )
    levels = _served(levels)
    if len(levels) < 2:
        return None
    lo, hi = levels[0], levels[-1]
    gain = 100.0 * (hi.decode_tok_s_total / lo.decode_tok_s_total - 1.0)
    step_growth = 100.0 * (hi.measured_step_ms / lo.measured_step_ms - 1.0)
    e2e = ""
    if lo.output_tok_s and hi.output_tok_s:
        e2e = (
            f"; end-to-end output tok/s (prefill and TTFT included) "
            f"{100.0 * (hi.output_tok_s / lo.output_tok_s - 1.0):+.3g} %"
        )
    shared = (
        "so the per-step overhead is shared"
        if hi.unexplained_per_token_ms < lo.unexplained_per_token_ms
        else "so the overhead grows with the batch: it is not per-step"
    )
    return Hypothesis(
        hypothesis=f"More concurrent streams ({lo.concurrency} -> {hi.concurrency})",
        predicted_gain_pct=gain,
        answer=(
            f"measured {gain:+.3g} % total decode tok/s; the step grew {step_growth:+.3g} % "
            f"while serving {hi.concurrency // max(lo.concurrency, 1)}x the tokens, {shared} "
            f"({_us_or_ms(lo.unexplained_per_token_ms)} -> "
            f"{_us_or_ms(hi.unexplained_per_token_ms)} unexplained per token){e2e}"
        ),
        evidence="measured concurrency sweep (decode rate = streams x 1000 / mean TPOT)",
    )


def _client_hypothesis(inp: VerdictInputs) -> Hypothesis | None:
    """H1: is the slowness in the client/measurement rather than in the server?"""
    srv, cli = inp.server_itl_ms, inp.client_itl_ms
    if not srv or not cli:
        return None
    diff = 100.0 * (cli - srv) / srv
    if abs(diff) <= CLIENT_AGREEMENT_PCT:
        ans = (
            f"no: the engine's own inter-token latency ({srv:.3g} ms, from /metrics) agrees "
            f"with the client's ({cli:.3g} ms, {diff:+.2g} %)"
        )
    elif diff > 0:
        ans = (
            f"partly: the client sees {cli:.3g} ms per token, the engine reports {srv:.3g} ms "
            f"({diff:+.2g} %): streaming, detokenization or the client add the difference"
        )
    else:
        ans = (
            f"the client's timing is unreliable here: it saw {cli:.3g} ms per token, the engine "
            f"reports {srv:.3g} ms ({diff:+.2g} %): tokens reach the client in bursts (a "
            "starved API frontend or client), so the attribution uses the engine's number"
        )
    return Hypothesis(
        hypothesis="The client or the measurement, not the server, is slow",
        answer=ans,
        evidence="bench server_metrics (vllm:inter_token_latency_seconds)",
    )


def _changes(inp: VerdictInputs) -> list[Change]:
    out: list[Change] = []
    base = (inp.prediction or {}).get("decode_tok_s_per_stream")
    for w in (inp.prediction or {}).get("what_if") or []:
        d = w.get("delta_pct")
        if d is None or d <= 0:
            continue
        out.append(
            Change(
                change=str(w.get("change")),
                predicted_gain_pct=float(d),
                predicted_tok_s=w.get("decode_tok_s_per_stream"),
                source="predict what-if",
                evidence=f"predicted {w.get('decode_tok_s_per_stream')} tok/s vs "
                f"{base} for this configuration"
                if base
                else None,
            )
        )
    for f in inp.findings:
        if f.get("kind") != "configurable" or not f.get("fix") or f.get("severity") == "info":
            continue
        ev = "; ".join(_clip(str(x)) for x in (f.get("evidence") or [])[:2]) or None
        out.append(
            Change(
                change=str(f.get("fix")),
                source=f"finding {f.get('id')}",
                evidence=(
                    f"{f.get('title')}: {f.get('predicted_effect') or ''}"
                    + (f" [{ev}]" if ev else "")
                ),
            )
        )
    lv = _served(inp.levels)
    if len(lv) >= 2:
        gain = 100.0 * (lv[-1].decode_tok_s_total / lv[0].decode_tok_s_total - 1.0)
        if gain > 0:
            out.append(
                Change(
                    change=f"serve {lv[-1].concurrency} streams at once (total "
                    "throughput, not per-stream speed)",
                    predicted_gain_pct=gain,
                    predicted_tok_s=lv[-1].decode_tok_s_total,
                    source="measured (concurrency sweep)",
                    evidence=f"decode tok/s summed over streams: {lv[0].decode_tok_s_total:.4g}"
                    f" at {lv[0].concurrency}, {lv[-1].decode_tok_s_total:.4g} at "
                    f"{lv[-1].concurrency}",
                )
            )
    out.sort(key=lambda c: -(c.predicted_gain_pct if c.predicted_gain_pct is not None else -1e9))
    return out


def _target(inp: VerdictInputs) -> TargetCheck | None:
    if inp.target_tok_s is None or inp.measured_tok_s is None:
        return None
    t, m = inp.target_tok_s, inp.measured_tok_s
    margin = 100.0 * (m / t - 1.0)
    met = m >= t
    text = f"met by {margin:+.3g} %" if met else f"missed by {-margin:.3g} %"
    if inp.measured_ci:
        lo, hi = inp.measured_ci
        if met and lo < t:
            text += " (on the mean only: the 95 % CI reaches below the target)"
        elif not met and hi >= t:
            text += " (on the mean; the 95 % CI reaches the target)"
    pred = (inp.prediction or {}).get("decode_tok_s_per_stream")
    if not met and pred:
        text += f"; the predicted ceiling for this configuration is {_f(pred)} tok/s" + (
            ", below the target: no setting of this layout reaches it" if pred < t else ""
        )
    return TargetCheck(target_tok_s=t, measured_tok_s=m, met=met, margin_pct=margin, text=text)


def build_verdict(inp: VerdictInputs) -> Verdict:
    """Assemble the verdict from whatever evidence exists."""
    a = inp.attribution
    headline, bound = _headline(inp, a)
    pred = inp.prediction or {}
    pred_tok = pred.get("decode_tok_s_per_stream")
    best = None
    wis = [w for w in pred.get("what_if") or [] if w.get("decode_tok_s_per_stream")]
    if wis:
        top = max(wis, key=lambda w: w["decode_tok_s_per_stream"])
        if pred_tok is None or top["decode_tok_s_per_stream"] > pred_tok:
            best = {"change": top.get("change"), "tok_s": top["decode_tok_s_per_stream"]}
    gap: dict[str, float] = {}
    if a is not None:
        gap = {
            "fundamental_ms": a.fundamental_ms,
            "configurable_ms": a.configurable_ms,
            "unexplained_ms": a.unexplained_ms,
            "measured_ms": a.measured_step_ms,
        }
    hyps = [
        h
        for h in (
            _nccl_hypothesis(inp, a),
            *_flag_hypotheses(inp),
            _memory_hypothesis(inp, a),
            _graph_hypothesis(inp, a),
            _streams_hypothesis(inp.levels),
            _client_hypothesis(inp),
        )
        if h is not None
    ]
    notes = []
    pct = None
    if pred_tok and inp.measured_tok_s:
        pct = 100.0 * inp.measured_tok_s / pred_tok
        notes.append(
            f"Measured rate is {pct:.3g} % of the predicted ceiling for this configuration."
        )
    target = _target(inp)
    if target and not target.met and best and best["tok_s"] >= target.target_tok_s:
        target.text += f"; {best['change']} is predicted to reach {best['tok_s']:.4g} tok/s"
    return Verdict(
        headline=headline,
        bound_by=bound,
        measured_tok_s=inp.measured_tok_s,
        measured_ci_low=inp.measured_ci[0] if inp.measured_ci else None,
        measured_ci_high=inp.measured_ci[1] if inp.measured_ci else None,
        predicted_tok_s=pred_tok,
        prediction_note=inp.prediction_note,
        pct_of_predicted=pct,
        best_config=best,
        gap=gap,
        changes=_changes(inp),
        hypotheses=hyps,
        target=target,
        notes=notes,
    )
