"""The measured split beside predict's expected and bound, per op class.

Classes that time the same set of predict's ops (rotary embedding and the KV write are one op
of predict's, ``attn.rope_kv_write``) form one bucket; each predict op is counted in one bucket
only (the first class in ``data/trace/classes.yaml`` that names it), so neither side counts an
op twice. GPU idle inside the step is compared with predict's ``host`` op.
"""

from __future__ import annotations

from dataclasses import dataclass

from ceiling.predict.schema import Prediction
from ceiling.trace.schema import ClassCompare, TraceSplit
from ceiling.trace.split import class_table


@dataclass
class Bucket:
    name: str
    classes: list[str]
    ops: list[str]
    group: bool
    ms: float
    calls: float
    kernels: list[str]


def buckets(split: TraceSplit) -> list[Bucket]:
    """The split's classes merged by the predict-op set they time (largest first); classes
    with no predict op (copies, fills, unmatched) are their own bucket with no ops."""
    table = class_table()
    tops: dict[str, list[str]] = {}
    for k in split.top_kernels:
        tops.setdefault(k.op_class, []).append(k.name[:120])
    out: dict[tuple[str, ...], Bucket] = {}
    for ct in split.classes:
        rec = table.get(ct.op_class) or {}
        ops = tuple(rec.get("predict_ops") or [])
        key = ops or (f"<{ct.op_class}>",)
        b = out.get(key)
        if b is None:
            out[key] = Bucket(
                ct.op_class, [ct.op_class], list(ops), bool(rec.get("group")), ct.ms, ct.calls,
                tops.get(ct.op_class, [])[:3],
            )  # fmt: skip
        else:
            b.classes.append(ct.op_class)
            b.name = "+".join(b.classes)
            b.ms += ct.ms
            b.calls += ct.calls
            b.kernels += tops.get(ct.op_class, [])[:2]
    return sorted(out.values(), key=lambda b: -b.ms)


def compare(split: TraceSplit, pred: Prediction) -> list[ClassCompare]:
    """Per bucket: measured ms, predict's expected and bound ms for the same ops, the gap over
    the bound (configurable: the bound is the physics), and predict's ops of no bucket."""
    if pred.expected is None or pred.bound is None:
        return []  # predicted by floors only (a CPU): no per-op figures to set beside
    exp = _by_op(pred.expected.ops)
    bnd = _by_op(pred.bound.ops)
    taken: set[str] = set()
    rows: list[ClassCompare] = []
    for b in buckets(split):
        mine = [o for o in b.ops if o not in taken and (o in exp or o in bnd)]
        taken.update(mine)
        e = sum(exp.get(o, 0.0) for o in mine)
        bd = sum(bnd.get(o, 0.0) for o in mine)
        rows.append(
            ClassCompare(
                bucket=b.name, classes=b.classes, predict_ops=mine, measured_ms=round(b.ms, 6),
                expected_ms=round(e, 6), bound_ms=round(bd, 6),
                gap_ms=round(b.ms - bd, 6) if mine else None,
            )
        )  # fmt: skip
    host_e, host_b = exp.get("host", 0.0), bnd.get("host", 0.0)
    taken.add("host")
    rows.append(
        ClassCompare(
            bucket="idle", classes=["idle"], predict_ops=["host"], measured_ms=split.idle_ms,
            expected_ms=round(host_e, 6), bound_ms=round(host_b, 6),
            gap_ms=round(split.idle_ms - host_b, 6),
        )
    )  # fmt: skip
    rest = [o for o in exp if o not in taken]
    if rest:
        rows.append(
            ClassCompare(
                bucket="not in the trace", classes=[], predict_ops=rest, measured_ms=0.0,
                expected_ms=round(sum(exp[o] for o in rest), 6),
                bound_ms=round(sum(bnd.get(o, 0.0) for o in rest), 6), gap_ms=None,
            )
        )  # fmt: skip
    return rows


def _by_op(records: list) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in records:
        out[r.name] = out.get(r.name, 0.0) + r.ms
    return out
