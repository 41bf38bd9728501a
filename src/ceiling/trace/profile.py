"""A trace's measured split as predict evidence: ``HardwareProfile.trace_ops`` (source
``trace``, above profile fits, tables and priors). Classes that measure one of predict's ops
time it directly; group classes (every GEMM when names do not tell the layer role) scale
their ops together; idle (GPU gaps inside the step) times predict's ``host`` op."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from ceiling.spec.profile import HardwareProfile, TraceOp
from ceiling.trace.schema import TraceSplit
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
    """The split's classes merged by the predict-op set they time (largest first): one
    profile entry each, so predict applies each op's evidence once. Classes with no predict op
    (copies, fills, unmatched) are their own bucket with no ops. (Not the comparison's rows:
    a role's GEMMs stay apart from the unroled ``gemm`` group here, each timing its own ops.)"""
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
                ct.op_class,
                [ct.op_class],
                list(ops),
                bool(rec.get("group")),
                ct.ms,
                ct.calls,
                tops.get(ct.op_class, [])[:3],
            )
        else:
            b.classes.append(ct.op_class)
            b.name = "+".join(b.classes)
            b.ms += ct.ms
            b.calls += ct.calls
            b.kernels += tops.get(ct.op_class, [])[:2]
    return sorted(out.values(), key=lambda b: -b.ms)


def to_profile(
    split: TraceSplit,
    base: HardwareProfile | None = None,
    batch: int | None = None,
    context: int | None = None,
    machine: str | None = None,
) -> HardwareProfile:
    """``split`` as a profile (merged into ``base``, e.g. a ``calibrate`` profile). ``batch``
    and ``context`` name the trace's setup when the trace does not (vLLM's annotations say the
    batch, detailed annotations the context): predict uses trace ops only at that batch."""
    b = batch if batch is not None else split.batch
    c = context if context is not None else split.context
    trace = ", ".join(r.path for r in split.ranks)
    ops: list[TraceOp] = []
    # classes timing the same predict ops (rope and the KV write: attn.rope_kv_write) are one
    # entry: predict applies each op's evidence once
    for bk in buckets(split):
        if not bk.ops:
            continue  # copies, fills, unmatched: no op of predict's to time
        ops.append(
            TraceOp(
                op_class=bk.name,
                ops=bk.ops,
                group=bk.group,
                ms_per_step=round(bk.ms, 6),
                calls_per_step=round(bk.calls, 3),
                engine=split.engine,
                batch=b,
                context=c,
                kernels=bk.kernels[:3],
                trace=trace,
            )
        )
    ops.append(
        TraceOp(
            op_class="idle",
            ops=["host"],
            ms_per_step=split.idle_ms,
            engine=split.engine,
            batch=b,
            context=c,
            trace=trace,
        )
    )
    prof = HardwareProfile(
        machine=machine,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        device=split.device if split.device == "cpu" else "cuda",
        trace_ops=ops,
        notes=[
            f"trace: {split.steps} decode steps of {split.step_ms:.3f} ms ({split.engine or 'generic'}"
            f"{' ' + split.engine_version if split.engine_version else ''}), "
            f"{split.coverage * 100:.1f} % of kernel time classified"
        ],
    )
    return base.merge(prof) if base is not None else prof
