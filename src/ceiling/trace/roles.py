"""GEMMs by layer role from their positions in the step, when a prediction gives the order.

cuBLAS names (``nvjet_*``, ``gemv2T_kernel_val``) do not say which projection a GEMM is, but a
decode step runs its GEMMs in the model's order: per layer the same sequence (qkv, o_proj,
gate_up, down for a dense transformer), then the per-step ones (lm_head). When the main
stream's GEMM calls of every step (``TraceSplit.gemm_calls_ms``, split-K halves joined) are
exactly predict's GEMM ops in that order, each call takes the role of its position; otherwise
the split keeps one ``gemm`` class and a note says why.
"""

from __future__ import annotations

from ceiling.predict.schema import Prediction
from ceiling.trace.schema import ClassTime, TraceSplit
from ceiling.trace.split import class_table

#: how close the calls' sum must be to the gemm class (side-stream GEMMs would break it)
_TOLERANCE = 0.01


def _role_of_op() -> dict[str, str]:
    """predict op -> role class (``gemm_*`` classes of data/trace/classes.yaml)."""
    out: dict[str, str] = {}
    for name, rec in class_table().items():
        if name.startswith("gemm_"):
            for op in rec.get("predict_ops") or []:
                out[op] = name
    return out


def assign(split: TraceSplit, pred: Prediction) -> TraceSplit:
    """``split`` with its ``gemm`` class broken into layer roles (a copy), or unchanged with a
    note when the positions cannot be matched to predict's GEMM ops."""
    gemm = next((c for c in split.classes if c.op_class == "gemm"), None)
    if gemm is None or pred.expected is None:
        return split
    members = set(class_table()["gemm"]["predict_ops"])
    ops = [o for o in pred.expected.ops if o.name in members and o.count > 0]
    roles = _role_of_op()
    why = _unmatched(split, gemm, ops, roles)
    if why:
        return split.model_copy(update={"notes": [*split.notes, f"GEMM roles not split: {why}"]})
    layers = max(int(o.count) for o in ops)
    per_layer = [o for o in ops if int(o.count) == layers]
    per_step = [o for o in ops if int(o.count) == 1 and layers > 1]
    order = [o.name for _ in range(layers) for o in per_layer] + [o.name for o in per_step]
    ms: dict[str, float] = {}
    calls: dict[str, float] = {}
    for name, t in zip(order, split.gemm_calls_ms, strict=True):
        role = roles[name]
        ms[role] = ms.get(role, 0.0) + t
        calls[role] = calls.get(role, 0.0) + 1
    scale = gemm.ms / sum(ms.values()) if sum(ms.values()) else 1.0  # rounding only
    table = class_table()
    new = [c for c in split.classes if c.op_class != "gemm"]
    for role, v in ms.items():
        new.append(
            ClassTime(
                op_class=role,
                ms=round(v * scale, 6),
                calls=calls[role],
                share=round(v * scale / split.step_ms, 4) if split.step_ms else 0.0,
                impl=gemm.impl,
                predict_ops=list(table[role]["predict_ops"]),
            )
        )
    new.sort(key=lambda c: -c.ms)
    note = (
        f"GEMM roles from call positions: {len(split.gemm_calls_ms)} GEMM calls per step = "
        f"{layers} layers x ({', '.join(o.name for o in per_layer)})"
        + (f" + {', '.join(o.name for o in per_step)}" if per_step else "")
    )
    return split.model_copy(update={"classes": new, "notes": [*split.notes, note]})


def _unmatched(split: TraceSplit, gemm: ClassTime, ops: list, roles: dict[str, str]) -> str:
    """Why the positions cannot be read as roles ('' when they can)."""
    if not split.gemm_calls_ms:
        return "the steps ran different numbers of GEMM calls"
    if abs(sum(split.gemm_calls_ms) - gemm.ms) > _TOLERANCE * gemm.ms:
        return "GEMMs ran on more than one stream"
    missing = sorted({o.name for o in ops if o.name not in roles})
    if missing:
        return f"no role class for {', '.join(missing)}"
    counts = {int(o.count) for o in ops}
    layers = max(counts)
    if not counts <= {layers, 1}:
        return f"predict's GEMM ops run {sorted(counts)} times per step (layers of several kinds)"
    want = layers * sum(1 for o in ops if int(o.count) == layers) + sum(
        1 for o in ops if int(o.count) == 1 and layers > 1
    )
    if want != len(split.gemm_calls_ms):
        return f"{len(split.gemm_calls_ms)} GEMM calls per step, predict runs {want}"
    return ""
