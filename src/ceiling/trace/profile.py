"""A trace's measured split as predict evidence: ``HardwareProfile.trace_ops`` (source
``trace``, above profile fits, tables and priors). Classes that measure one of predict's ops
time it directly; group classes (every GEMM when names do not tell the layer role) scale
their ops together; idle (GPU gaps inside the step) times predict's ``host`` op."""

from __future__ import annotations

from datetime import UTC, datetime

from ceiling.spec.profile import HardwareProfile, TraceOp
from ceiling.trace.schema import TraceSplit
from ceiling.trace.split import class_table


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
    table = class_table()
    b = batch if batch is not None else split.batch
    c = context if context is not None else split.context
    trace = ", ".join(r.path for r in split.ranks)
    tops: dict[str, list[str]] = {}
    for k in split.top_kernels:
        tops.setdefault(k.op_class, []).append(k.name[:120])
    ops: list[TraceOp] = []
    for ct in split.classes:
        rec = table.get(ct.op_class) or {}
        names = list(rec.get("predict_ops") or [])
        if not names:
            continue  # copies, fills, unmatched: no op of predict's to time
        ops.append(
            TraceOp(
                op_class=ct.op_class, ops=names, group=bool(rec.get("group")),
                ms_per_step=ct.ms, calls_per_step=ct.calls, engine=split.engine, batch=b,
                context=c, kernels=tops.get(ct.op_class, [])[:3], trace=trace,
            )
        )  # fmt: skip
    ops.append(
        TraceOp(
            op_class="idle", ops=["host"], ms_per_step=split.idle_ms, engine=split.engine,
            batch=b, context=c, trace=trace,
        )
    )  # fmt: skip
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
