"""The measured split beside predict's expected and bound, class by class: the one comparison
``ceiling trace``, the doctor's verdict and both reports use (noun: ``MeasuredSplit``).

Why: without a trace the doctor splits the step with predict's model, a forecast; with one, the
split is measured (issue 23). Per class: the measured ms, predict's expected and bound for the
ops that class measures (``ClassTime.predict_ops``), the fundamental part (the bound, or the
measurement where it is shorter) and the configurable gap (measured - bound). GPU idle inside
the step is its own row (host / launch overhead: no bound of its own, all configurable). Classes
whose ops predict has no bound for (or a prediction that names other ops: a CPU's floors) are
``unbounded``: measured, but neither fundamental nor configurable is claimed for them.

Classes that share predict ops (rope and the KV write both measure ``attn.rope_kv_write``; the
unroled ``gemm`` class and a role's GEMMs) are one row, so no predicted op is counted twice.
Predicted ops no class measured are summed apart (``unseen_*``). On several ranks: the slowest
rank's step (the headline), the spread between ranks, and inside collectives the time spent
waiting for the slowest rank apart from the transfer itself.
"""

from __future__ import annotations

from ceiling.predict.schema import Prediction, StepBlock
from ceiling.trace.schema import ClassRow, ClassTime, MeasuredSplit, TraceSplit
from ceiling.trace.split import class_table

IDLE = "idle (host / launch)"
#: predict's op for the host's share of the step: what GPU idle is set against
HOST_OP = "host"
#: op classes that are collectives (their wait is measured across ranks)
COLLECTIVE_COMPONENT = "collectives"


def _ops_ms(block: StepBlock | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for op in block.ops if block is not None else []:
        out[op.name] = out.get(op.name, 0.0) + op.ms
    return out


def _groups(classes: list[ClassTime]) -> list[list[ClassTime]]:
    """Classes joined where they share a predict op (union of overlapping op sets)."""
    groups: list[list[ClassTime]] = []
    for c in classes:
        hit = [g for g in groups if any(set(c.predict_ops) & set(x.predict_ops) for x in g)]
        merged = [c, *(x for g in hit for x in g)]
        groups = [g for g in groups if g not in hit] + [merged]
    return groups


def _component_floors(rows: list[ClassRow], prediction: Prediction | None) -> None:
    """A prediction without per-op figures (a CPU's floors: weights, KV, compute as whole
    components): each floor is the bound of the classes of that component, shared among them by
    their measured time. Only weights and KV: which class would hold the compute floor (GEMMs
    also read the weights) the names do not tell, so it is claimed by none."""
    if prediction is None or (prediction.bound is not None and prediction.bound.ops):
        return
    floors = prediction.components_ms
    for comp in ("weights", "kv"):
        mine = [r for r in rows if r.component == comp and r.bound_ms is None]
        total = sum(r.measured_ms for r in mine)
        if comp not in floors or total <= 0:
            continue
        for r in mine:
            r.bound_ms = floors[comp] * r.measured_ms / total
            r.fundamental_ms = min(r.bound_ms, r.measured_ms)
            r.gap_ms = r.measured_ms - r.bound_ms


def measured_split(
    sp: TraceSplit,
    prediction: Prediction | None,
    label: str = "single",
    files: list[str] | None = None,
) -> MeasuredSplit:
    """``sp`` (a trace's split) set against ``prediction``'s expected and bound, per class."""
    expected, bound = (
        (_ops_ms(prediction.expected), _ops_ms(prediction.bound))
        if prediction is not None
        else ({}, {})
    )
    table = class_table()
    rows: list[ClassRow] = []
    claimed: set[str] = set()
    for group in _groups([c for c in sp.classes if c.ms > 0 or c.calls > 0]):
        group.sort(key=lambda c: (-c.ms, c.op_class))
        ops = sorted({o for c in group for o in c.predict_ops})
        claimed.update(ops)
        ms = sum(c.ms for c in group)
        known = [o for o in ops if o in bound]
        b = sum(bound[o] for o in known) if known else None
        e = sum(expected.get(o, 0.0) for o in known) if known and expected else None
        coll = [c for c in group if c.wait_ms is not None]
        rows.append(
            ClassRow(
                op_class=" + ".join(c.op_class for c in group),
                measured_ms=ms,
                share_pct=ms / sp.step_ms * 100 if sp.step_ms else 0.0,
                component=(table.get(group[0].op_class) or {}).get("component"),
                predict_ops=ops,
                expected_ms=e,
                bound_ms=b,
                fundamental_ms=min(b, ms) if b is not None else None,
                gap_ms=ms - b if b is not None else None,
                transfer_ms=sum(c.transfer_ms or 0.0 for c in coll) if coll else None,
                wait_ms=sum(c.wait_ms or 0.0 for c in coll) if coll else None,
            )
        )
    rows.append(
        ClassRow(
            op_class=IDLE,
            measured_ms=sp.idle_ms,
            share_pct=sp.idle_ms / sp.step_ms * 100 if sp.step_ms else 0.0,
            component="host",
            predict_ops=[HOST_OP],
            expected_ms=expected.get(HOST_OP) if expected else None,
            bound_ms=0.0,  # the bound has no host time: all of the idle is configurable
            fundamental_ms=0.0,
            gap_ms=sp.idle_ms,
        )
    )
    _component_floors(rows, prediction)
    rows.sort(key=lambda r: -r.measured_ms)
    fundamental = sum(r.fundamental_ms or 0.0 for r in rows)
    configurable = sum(max(r.gap_ms or 0.0, 0.0) for r in rows if r.bound_ms is not None)
    unbounded = sum(r.measured_ms for r in rows if r.bound_ms is None)
    claimed.add(HOST_OP)
    unseen = sorted(o for o, v in expected.items() if v > 0 and o not in claimed)
    unseen_bound = sum(bound.get(o, 0.0) for o in unseen)
    ar = [c for c in sp.classes if c.op_class == "allreduce"]
    ar_wait = ar[0].wait_ms if ar else None
    ar_ms = ar[0].ms if ar else 0.0
    # several ranks: what the mean rank spends in allreduces, transfer + waiting for the
    # slowest rank (the headline rank is the slowest, which itself waits least)
    cw = next((w for w in sp.collective_waits if w.op_class == "allreduce"), None)
    if cw is not None:
        ar_ms, ar_wait = cw.transfer_ms + cw.wait_ms_mean, cw.wait_ms_mean
    out = MeasuredSplit(
        label=label,
        files=list(files or []),
        device=sp.device,
        steps=sp.steps,
        step_ms=sp.step_ms,
        idle_ms=sp.idle_ms,
        coverage=sp.coverage,
        rows=rows,
        fundamental_ms=fundamental,
        configurable_ms=configurable,
        unbounded_ms=unbounded,
        unseen_ops=unseen,
        unseen_expected_ms=sum(expected[o] for o in unseen),
        unseen_bound_ms=unseen_bound,
        ranks=max(len(sp.ranks), 1),
        slowest_rank=sp.slowest_rank,
        rank_spread_pct=sp.rank_spread_pct,
        missing_ranks=list(sp.missing_ranks),
        allreduce_ms=ar_ms,
        allreduce_wait_ms=ar_wait,
        notes=list(sp.notes),
    )
    if prediction is not None and prediction.bound is not None and not prediction.bound.ops:
        out.notes.append(
            "predict gives this hardware's floors as whole components (weights, KV), not per "
            "op: each floor is the bound of the classes of that component, shared by their "
            "measured time"
        )
    return out
