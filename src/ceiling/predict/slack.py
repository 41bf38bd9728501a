"""Can the evidence behind ``expected`` be true, given one measured step?

A measured step leaves ``slack = measured - bound`` beyond the physical floor (every op at its
bound). Each op's ``expected - bound`` spends part of it; summed per source of evidence
(``table``, ``prior``, ``profile``, ``engine``), bound + every op's excess = expected. When the
ops of one source alone cost more than the whole slack, that evidence cannot all be true in this
step: the kernels the engine ran were faster than it says (another kernel, or an artifact of
isolated timing), and no fit of the other ops can repair it. When the slack exceeds every op's
cost together, the prediction leaves time unexplained.

Used by the accuracy harness over published runs (``calibration.evidence_checks``) and by the
doctor when a measured step is much shorter than predicted. A diagnostic, never an input: no
constant is fitted to it.
"""

from __future__ import annotations

from pydantic import BaseModel

from ceiling.predict.schema import Prediction


class SlackSplit(BaseModel):
    """One measured step against the per-op evidence of its prediction (ms per step)."""

    measured_ms: float
    bound_ms: float
    slack_ms: float
    excess_ms_by_source: dict[str, float]
    unexplained_ms: float
    contradicted: list[str]  # sources whose excess alone exceeds the slack
    top_ops: list[tuple[str, str, float]]  # (op, source, excess ms), largest first


def split_slack(pred: Prediction, measured_ms: float) -> SlackSplit | None:
    """The split of ``measured_ms`` (one decode step at the prediction's batch), or None when the
    prediction has no per-op ``expected`` and ``bound`` (a CPU's floors)."""
    exp, bnd = pred.expected, pred.bound
    if exp is None or bnd is None or not exp.ops:
        return None
    # the bound lists an op once per (name, count) in the same order, and leaves out the ops it
    # hides entirely (a shared expert on its own stream): those have no floor
    floors: dict[tuple[str, float], list[float]] = {}
    for b in bnd.ops:
        floors.setdefault((b.name, b.count), []).append(b.ms)
    by_source: dict[str, float] = {}
    per_op: dict[tuple[str, str], float] = {}
    for o in exp.ops:
        queue = floors.get((o.name, o.count))
        extra = max(0.0, o.ms - (queue.pop(0) if queue else 0.0))
        by_source[o.source] = by_source.get(o.source, 0.0) + extra
        per_op[(o.name, o.source)] = per_op.get((o.name, o.source), 0.0) + extra
    slack = measured_ms - bnd.decode_ms_per_token
    top = sorted(((n, s, round(v, 3)) for (n, s), v in per_op.items()), key=lambda t: -t[2])
    return SlackSplit(
        measured_ms=round(measured_ms, 3),
        bound_ms=round(bnd.decode_ms_per_token, 3),
        slack_ms=round(slack, 3),
        excess_ms_by_source={k: round(v, 3) for k, v in sorted(by_source.items())},
        unexplained_ms=round(max(0.0, slack - sum(by_source.values())), 3),
        contradicted=sorted(s for s, v in by_source.items() if v > slack),
        top_ops=top[:4],
    )
