"""The measured split of a trace's decode steps by op class.

Per step (from one step's start to the next's), every instant the GPU is busy is given to
exactly one kernel: the main stream's (the stream with the most kernel time) when it runs one,
else the side stream's that started first. What ran on a side stream while the main stream was
busy is named in ``overlap`` and not counted again. The rest of the step, no kernel running, is
``idle``: host and launch overhead. So per step: sum of classes + idle == step, exactly.

On a CPU trace the same accounting runs over the top-level operators of the thread that holds
the step annotations (nested operators are inside their parents' time).
"""

from __future__ import annotations

import re
import statistics
from bisect import bisect_left, bisect_right
from collections import defaultdict
from functools import cache
from typing import Any

from ceiling.engines.trace_patterns import COLLECTIVE_CLASSES, Classifier, guess_engine
from ceiling.errors import CeilingError
from ceiling.spec._data import DataModel, load_yaml
from ceiling.trace.ranks import RankAccount as _Rank
from ceiling.trace.ranks import missing, rank_split, skew, slowest, waits
from ceiling.trace.schema import (
    ClassTime,
    KernelEvent,
    KernelStat,
    OverlapNote,
    RankTrace,
    StepTime,
    TraceSplit,
    Unmatched,
)
from ceiling.trace.steps import from_annotations, periodic

TOP_KERNELS = 15
#: cuBLAS/cuBLASLt's split-K reduction kernel (the second half of one GEMM call)
_SPLITK = re.compile(r"splitKreduce|splitK_reduce|reduce_splitk", re.IGNORECASE)


class OpClassInfo(DataModel):
    """One op class of ``data/trace/classes.yaml``."""

    what: str
    predict_ops: list[str]
    group: bool = False
    component: str


class ClassesFile(DataModel):
    schema_version: int
    classes: dict[str, OpClassInfo]


@cache
def class_table() -> dict[str, dict[str, Any]]:
    """``data/trace/classes.yaml`` (validated at load): each op class's meaning, predict ops
    and component (as plain mappings: the trace readers' shape)."""
    table = load_yaml("trace/classes.yaml", schema=ClassesFile)
    return {name: info.model_dump() for name, info in table.classes.items()}


def split(
    traces: list[RankTrace],
    engine: str | None = None,
    window: tuple[float, float] | None = None,
) -> TraceSplit:
    """The measured step of ``traces`` (one per rank) by op class.

    ``engine`` picks the kernel-name table (default: the engine a trace names, else generic
    names only); ``window`` (trace microseconds, start and end) limits the steps to those
    wholly inside it: a window that begins mid-step drops that partial step.
    """
    if not traces:
        raise CeilingError("no trace to split", fix="pass one trace file per rank")
    traces = [one for t in traces for one in per_device(t)]
    ranks_seen = [t.rank for t in traces if t.rank is not None]
    dup = {r for r in ranks_seen if ranks_seen.count(r) > 1}
    if dup:
        raise CeilingError(
            f"two traces claim rank {sorted(dup)[0]}",
            fix="pass one trace file per rank (the files of one recording)",
        )
    engine = engine or next((t.engine_hint for t in traces if t.engine_hint), None)
    guessed = None
    if engine is None:  # a trace that names no engine: the one whose kernels it holds
        names = {e.name for t in traces for e in t.events} | {
            a.name for t in traces for a in t.annotations
        }
        engine = guessed = guess_engine(names)
    cls = Classifier(engine)
    per_rank = [_rank(t, cls, window) for t in traces]
    counted = [r for r in per_rank if r.n]
    if not counted:
        raise CeilingError(
            f"no complete decode step in {traces[0].path}"
            + (" inside the window" if window else ""),
            fix="record at least two steady decode steps (a step ends where the next begins)",
        )
    transfer = skew(counted)
    head = slowest(counted)
    out = _result(head, cls, engine, traces)
    if guessed is not None:
        out.notes.append(
            f"engine {guessed}: from the trace's kernel and annotation names (the trace names "
            "none; pass --engine to choose)"
        )
    out.ranks = [rank_split(r) for r in per_rank]
    if len(counted) > 1:
        means = [r.step_ms() for r in counted]
        out.rank_spread_pct = round((max(means) - min(means)) / min(means) * 100, 2)
    out.slowest_rank = head.trace.rank
    out.collective_waits = waits(counted, transfer)
    out.missing_ranks = missing(traces)
    if out.missing_ranks:
        out.notes.append(
            f"rank(s) {', '.join(map(str, out.missing_ranks))} of "
            f"{max(t.world_size or 0 for t in traces)} have no trace: the slowest rank may be "
            "one of them, and waiting inside collectives is measured among the ranks given only"
        )
    for r in per_rank:
        if not r.n:
            out.notes.append(f"{r.trace.path}: no complete decode step (left out)")
    return out


def per_device(t: RankTrace) -> list[RankTrace]:
    """A trace of one process that drove several GPUs, as one trace per GPU (each GPU is a
    rank of its own: its kernels never overlap another GPU's in wall time)."""
    devices = sorted({e.device for e in t.events})
    if t.device != "gpu" or len(devices) < 2:
        return [t]
    out = []
    for d in devices:
        sub = t.model_copy(
            update={
                "events": [e for e in t.events if e.device == d],
                "rank": d,
                "world_size": t.world_size or len(devices),
                "path": f"{t.path}#gpu{d}",
                "notes": [*t.notes, f"{t.path}: GPU {d} of {len(devices)} driven by one process"],
            }
        )
        out.append(sub)
    return out


# ----------------------------------------------------------------------------- one rank


def _rank(t: RankTrace, cls: Classifier, window: tuple[float, float] | None) -> _Rank:
    r = _Rank(t)
    events = t.events
    anns = t.annotations
    if window is not None:
        w0, w1 = window
        events = [e for e in events if e.ts_us >= w0 and e.end_us <= w1]
        anns = [a for a in anns if a.ts_us >= w0 and a.ts_us + a.dur_us <= w1]
    if t.device == "cpu":
        events = _step_thread(events, anns, cls, r)
    gpu = t.device == "gpu"
    marks, source = from_annotations(anns, events, cls, gpu)
    if not marks:
        marks, source = periodic(_main_only(events))
    if not marks:
        r.notes.append(f"{t.path}: no step structure found")
        return r
    r.source = source
    if events and events[0].ts_us < marks[0].start_us:
        # activity before the first step start: the tail of a step the recording (or the
        # window) began inside of
        r.skipped["partial (the recording or window starts mid-step)"] += 1
    if len(marks) == 1:
        m = marks[0]
        last = max((e.end_us for e in events if e.ts_us >= m.start_us), default=m.start_us)
        ends = [max(last, m.end_hint_us or last)]
    else:
        ends = [b.start_us for b in marks[1:]]
        r.skipped["last (its end is the next step's start, not recorded)"] += 1
        marks = marks[:-1]
    main = _main_stream(events)
    bounds = []
    for m, end in zip(marks, ends, strict=True):
        if not m.decode:
            r.skipped["prefill (context requests in the step)"] += 1
            continue
        bounds.append((m.start_us, end, m.label))
        g = m.groups or {}
        if g.get("generation", "").isdigit():
            r.batches.append(int(g["generation"]))
            if g.get("generation_seq_sum", "").isdigit() and int(g["generation"]):
                r.contexts.append(int(g["generation_seq_sum"]) / int(g["generation"]))
    _attribute(r, events, bounds, main, cls)
    return r


def _step_thread(
    events: list[KernelEvent], anns: list[Any], cls: Classifier, r: _Rank
) -> list[KernelEvent]:
    """CPU trace: the operators of the thread that holds the step annotations (else the
    busiest thread); other threads' time is said in a note, not counted in the step."""
    by_thread: dict[int, float] = defaultdict(float)
    for e in events:
        by_thread[e.stream] += e.dur_us
    if not by_thread:
        return events
    step_threads = [a.thread for a in anns if cls.step_annotation(a.name) is not None]
    tid = (
        max(set(step_threads), key=step_threads.count)
        if step_threads
        else max(by_thread, key=lambda k: by_thread[k])
    )
    r.trace.ops_thread = tid
    others = sum(v for k, v in by_thread.items() if k != tid)
    if others > 0:
        r.notes.append(
            f"{len(by_thread) - 1} other thread(s) ran {others / 1e3:.2f} ms of operators in the "
            "trace: not the step's (the step is the thread that holds the step annotations)"
        )
    return [e for e in events if e.stream == tid]


def _main_stream(events: list[KernelEvent]) -> int:
    busy: dict[int, float] = defaultdict(float)
    for e in events:
        busy[e.stream] += e.dur_us
    return max(busy, key=lambda k: busy[k]) if busy else 0


def _main_only(events: list[KernelEvent]) -> list[KernelEvent]:
    main = _main_stream(events)
    return [e for e in events if e.stream == main and e.kind == "kernel"] or events


def _attribute(
    r: _Rank,
    events: list[KernelEvent],
    bounds: list[tuple[float, float, str]],
    main: int,
    cls: Classifier,
) -> None:
    """Give each counted step's wall time to its kernels (main stream first), the rest idle."""
    starts = [e.ts_us for e in events]
    for k, (s, e, label) in enumerate(bounds):
        # events overlapping [s, e): the ones starting inside, and any that began before s
        # and run into it (kernels are short; look back over the longest one)
        lo = bisect_left(starts, s)
        back = lo
        while back > 0 and events[back - 1].end_us > s and lo - back < 64:
            back -= 1
        hi = bisect_left(starts, e)
        items = events[back:hi]
        mains = [x for x in items if x.stream == main]
        sides = [x for x in items if x.stream != main]
        union: list[list[float]] = []
        coll: list[tuple[str, float]] = []
        gemms: list[float] = []  # the main stream's GEMM calls in order (roles: trace.roles)
        for x in mains:
            a, b = max(x.ts_us, s), min(x.end_us, e)
            if b <= a:
                continue
            if union and a < union[-1][1]:
                got = max(0.0, b - union[-1][1])
                union[-1][1] = max(union[-1][1], b)
            else:
                got = b - a
                union.append([a, b])
            if _add(r, x, got, cls, coll, s) == "gemm":
                # cuBLAS's split-K reduction finishes the GEMM before it: one call
                if gemms and _SPLITK.search(x.name):
                    gemms[-1] += got
                else:
                    gemms.append(got)
        for x in sorted(sides, key=lambda v: v.ts_us):
            a, b = max(x.ts_us, s), min(x.end_us, e)
            if b <= a:
                continue
            covered = _covered(union, a, b)
            got = (b - a) - covered
            _insert(union, a, b)
            m = _add(r, x, got, cls, coll, s)
            key = (x.stream, m)
            r.hidden[key] += covered
            r.side_own[key] += b - a
            r.side_names[key][x.name] += b - a
        busy = sum(b - a for a, b in union)
        step_us = e - s
        r.steps.append(
            StepTime(
                index=k,
                start_us=s,
                ms=round(step_us / 1e3, 6),
                busy_ms=round(busy / 1e3, 6),
                idle_ms=round((step_us - busy) / 1e3, 6),
                label=label[:80],
            )
        )
        r.coll.append(coll)
        r.gemm_calls.append(gemms)


def _add(
    r: _Rank, x: KernelEvent, got: float, cls: Classifier, coll: list[tuple[str, float]], s: float
) -> str:
    m = cls.classify(x.name)
    if x.kind == "memcpy" and m.op_class == "unmatched":
        op = "copy"
    elif x.kind == "memset" and m.op_class == "unmatched":
        op = "memset"
    else:
        op = m.op_class
    r.cls_us[op] += got
    r.name_us[x.name] += got
    if x.ts_us >= s:  # a kernel that began in the previous step was counted there
        r.cls_calls[op] += 1
        r.name_calls[x.name] += 1
        r.name_own_us[x.name] += x.dur_us
        if m.impl:
            r.cls_impl[op].add(m.impl)
        if op in COLLECTIVE_CLASSES:
            coll.append((op, x.dur_us))
    return op


def _covered(union: list[list[float]], a: float, b: float) -> float:
    """How much of [a, b) the sorted disjoint intervals ``union`` already cover."""
    i = max(bisect_right([u[0] for u in union], a) - 1, 0)
    got = 0.0
    while i < len(union) and union[i][0] < b:
        lo, hi = max(union[i][0], a), min(union[i][1], b)
        if hi > lo:
            got += hi - lo
        i += 1
    return got


def _insert(union: list[list[float]], a: float, b: float) -> None:
    """Add [a, b) to the sorted disjoint intervals, merging what it touches."""
    keys = [u[0] for u in union]
    i = bisect_left(keys, a)
    if i > 0 and union[i - 1][1] >= a:
        i -= 1
    j = i
    lo, hi = a, b
    while j < len(union) and union[j][0] <= hi:
        lo, hi = min(lo, union[j][0]), max(hi, union[j][1])
        j += 1
    union[i:j] = [[lo, hi]]


# ----------------------------------------------------------------------------- result


def _result(r: _Rank, cls: Classifier, engine: str | None, traces: list[RankTrace]) -> TraceSplit:
    n = r.n
    table = class_table()
    step_ms = r.step_ms()
    busy_ms = sum(s.busy_ms for s in r.steps) / n
    idle_ms = sum(s.idle_ms for s in r.steps) / n
    wait, matched = r.wait_us, r.matched_steps
    classes = []
    for op, us in sorted(r.cls_us.items(), key=lambda kv: -kv[1]):
        ms = us / n / 1e3
        ct = ClassTime(
            op_class=op,
            ms=round(ms, 6),
            calls=round(r.cls_calls[op] / n, 3),
            share=round(ms / step_ms, 4) if step_ms else 0.0,
            impl=sorted(r.cls_impl[op]),
            predict_ops=list((table.get(op) or {}).get("predict_ops") or []),
        )
        if op in COLLECTIVE_CLASSES and wait is not None and matched:
            w = wait.get(op, 0.0) / matched / 1e3
            ct.wait_ms = round(min(w, ms), 6)
            ct.transfer_ms = round(max(ms - w, 0.0), 6)
        classes.append(ct)
    total = sum(r.cls_us.values())
    unmatched_us = r.cls_us.get("unmatched", 0.0)
    names = sorted(r.name_us.items(), key=lambda kv: -kv[1])
    top = [
        KernelStat(
            name=name,
            op_class=_op_of(cls, name),
            impl=cls.classify(name).impl,
            ms=round(us / n / 1e3, 6),
            calls=round(r.name_calls[name] / n, 3),
            mean_us=round(r.name_own_us[name] / max(r.name_calls[name], 1), 3),
        )
        for name, us in names[:TOP_KERNELS]
    ]
    unmatched = [
        Unmatched(name=name, ms=round(us / n / 1e3, 6), count=round(r.name_calls[name] / n, 3))
        for name, us in names
        if cls.classify(name).op_class == "unmatched" and _op_of(cls, name) == "unmatched"
    ]
    overlap = []
    for (stream, op), hid in sorted(r.hidden.items(), key=lambda kv: -kv[1]):
        if hid <= 0:
            continue
        tops = sorted(r.side_names[(stream, op)].items(), key=lambda kv: -kv[1])[:3]
        overlap.append(
            OverlapNote(
                stream=stream,
                op_class=op,
                hidden_ms=round(hid / n / 1e3, 6),
                own_ms=round(r.side_own[(stream, op)] / n / 1e3, 6),
                top_kernels=[k for k, _ in tops],
            )
        )
    notes = list(r.notes)
    if r.trace.device == "cpu" and r.trace.nested_ops_skipped:
        notes.append(
            f"{r.trace.nested_ops_skipped} nested operators are inside their parents' time "
            "(not counted again)"
        )
    for t in traces:
        notes += t.notes
    engine_version = next((t.engine_version for t in traces if t.engine_version), None)
    seqs = r.gemm_calls
    same = bool(seqs) and len({len(q) for q in seqs}) == 1
    gemm_calls = [round(sum(col) / n / 1e3, 6) for col in zip(*seqs, strict=True)] if same else []
    return TraceSplit(
        gemm_calls_ms=gemm_calls,
        engine=cls.engine or engine,
        engine_version=engine_version,
        device=r.trace.device,
        step_source=r.source,
        steps=n,
        steps_skipped=dict(r.skipped),
        batch=r.batches[0] if r.batches and len(set(r.batches)) == 1 else None,
        context=round(sum(r.contexts) / len(r.contexts)) if r.contexts else None,
        step_ms=round(step_ms, 6),
        step_ms_median=round(statistics.median(s.ms for s in r.steps), 6),
        step_ms_min=round(min(s.ms for s in r.steps), 6),
        step_ms_max=round(max(s.ms for s in r.steps), 6),
        busy_ms=round(busy_ms, 6),
        idle_ms=round(idle_ms, 6),
        classes=classes,
        coverage=round(1 - unmatched_us / total, 4) if total else 0.0,
        unmatched=unmatched,
        top_kernels=top,
        overlap=overlap,
        per_step=r.steps,
        notes=notes,
    )


def _op_of(cls: Classifier, name: str) -> str:
    m = cls.classify(name)
    if m.op_class != "unmatched":
        return m.op_class
    if name.startswith("Memcpy"):
        return "copy"
    if name.startswith("Memset"):
        return "memset"
    return "unmatched"
