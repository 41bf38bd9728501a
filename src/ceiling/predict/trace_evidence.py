"""Evidence from an engine's own trace (``HardwareProfile.trace_ops``, written by
``ceiling trace --out``): the top of predict's ladder, above profile fits, tables and priors.

Each entry times predict's ops of one op class per step. An entry naming one op times it
directly; a ``group`` entry (all GEMMs when kernel names do not tell the layer role) scales
its ops' expected times together to the measured sum, so the model keeps the shares and the
trace sets the total. Ops an entry does not name keep their previous evidence. An entry
recorded at another batch (or, for attention, another context) does not apply.
"""

from __future__ import annotations

from dataclasses import replace

from ceiling.predict.ladder import ladder
from ceiling.predict.opspec import OpSpec, OpTime
from ceiling.predict.resolved import Setup

#: op kinds whose time grows with the context: a trace at another context does not time them
_CONTEXT_KINDS = frozenset({"attention", "mla", "gdn"})
_CONTEXT_TOLERANCE = 0.10


def apply(
    s: Setup, ops: list[OpSpec], times: list[OpTime], batch: int, context: int
) -> tuple[list[OpTime], list[str]]:
    """``times`` with the trace's measurements in place where the profile has them; notes
    that say which entries applied and which did not (and why)."""
    prof = s.profile
    entries = list(prof.trace_ops) if prof is not None else []
    if not entries:
        return times, []
    notes: list[str] = []
    out = list(times)
    done: set[int] = set()
    engine = s.dep.engine
    # entries of one op first, then the groups over what is left
    for e in sorted(entries, key=lambda x: (x.group, -len(x.ops))):
        if e.engine and engine != e.engine:
            notes.append(f"trace {e.op_class}: recorded on {e.engine}, not {engine}: not used")
            continue
        if e.batch is not None and e.batch != batch:
            notes.append(f"trace {e.op_class}: recorded at batch {e.batch}, not {batch}: not used")
            continue
        idx = [i for i, op in enumerate(ops) if op.name in e.ops and i not in done]
        off_context = e.context is not None and (
            abs(context - e.context) > _CONTEXT_TOLERANCE * e.context
        )
        if off_context and any(ops[i].kind in _CONTEXT_KINDS for i in idx):
            notes.append(
                f"trace {e.op_class}: recorded at context {e.context}, not {context}: not used"
            )
            continue
        if not idx:
            continue
        measured_us = e.ms_per_step * 1e3
        predicted = sum(ops[i].count * out[i].expected_us for i in idx)
        calls = sum(ops[i].count for i in idx)
        for i in idx:
            if predicted > 0:
                per_call = out[i].expected_us * measured_us / predicted
            else:  # the model gave them nothing: the measured time shared by calls
                per_call = measured_us / calls if calls else 0.0
            how = "scaled with its class" if len(idx) > 1 else "measured"
            out[i] = replace(
                out[i],
                expected_us=per_call,
                source="trace",
                confidence=ladder().confidence.trace,
                note=f"trace {e.op_class}: {e.ms_per_step:.4f} ms/step ({how})",
            )
            done.add(i)
        notes.append(
            f"trace {e.op_class}: {e.ms_per_step:.4f} ms/step over "
            + ", ".join(ops[i].name for i in idx)
        )
    return out, notes
