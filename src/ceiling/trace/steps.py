"""Where a trace's steps begin: the engine's step annotations, ``ProfilerStep#N``, or (neither)
the kernels' periodic structure. Pure functions over a RankTrace's nouns."""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections import Counter, defaultdict
from dataclasses import dataclass

from ceiling.engines.trace_patterns import Classifier
from ceiling.trace.schema import Annotation, KernelEvent


@dataclass
class StepMark:
    """The start of one step (trace microseconds), its label, and whether it is a decode step."""

    start_us: float
    label: str
    decode: bool = True
    end_hint_us: float | None = None  # the annotation's end (used for a lone step)
    groups: dict[str, str] | None = None  # what the annotation says (requests, tokens)


def from_annotations(
    annotations: list[Annotation],
    events: list[KernelEvent],
    cls: Classifier,
    gpu: bool,
) -> tuple[list[StepMark], str]:
    """Step starts from the first step-annotation pattern (engine's before ProfilerStep#N) that
    any annotation matches; ([], '') when none does. On a GPU a step starts at its first
    activity launched inside the annotation (a kernel's launch time, from its correlation id),
    so steps are measured on the GPU's timeline; on a CPU at the annotation itself."""
    for rx, pat in cls.step_patterns():
        hits = [(a, rx.match(a.name)) for a in annotations]
        chosen = [(a, m) for a, m in hits if m is not None]
        if not chosen:
            continue
        marks: list[StepMark] = []
        launch_sorted = _launch_index(events) if gpu else None
        for a, m in chosen:
            groups = m.groupdict()
            decode = str(groups.get("context") or "0") == "0"
            start = a.ts_us if not gpu else _first_launched(events, launch_sorted, a)
            if start is None:
                continue  # an annotation that launched nothing on the GPU (an empty step)
            marks.append(StepMark(start, a.name, decode, a.ts_us + a.dur_us, groups))
        marks.sort(key=lambda s: s.start_us)
        return marks, f"{pat.name} annotations"
    return [], ""


def _launch_index(events: list[KernelEvent]) -> tuple[list[float], list[int]] | None:
    pairs = sorted((e.launch_ts_us, i) for i, e in enumerate(events) if e.launch_ts_us is not None)
    if not pairs:
        return None
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _first_launched(
    events: list[KernelEvent],
    index: tuple[list[float], list[int]] | None,
    a: Annotation,
) -> float | None:
    end = a.ts_us + a.dur_us
    if index is None:  # no launch records: the first activity that starts inside or after it
        starts = [e.ts_us for e in events]
        i = bisect_left(starts, a.ts_us)
        return events[i].ts_us if i < len(events) else None
    ts, idx = index
    lo, hi = bisect_left(ts, a.ts_us), bisect_left(ts, end)
    if lo >= hi:
        return None
    return min(events[idx[j]].ts_us for j in range(lo, hi))


def periodic(events: list[KernelEvent]) -> tuple[list[StepMark], str]:
    """Steps from the kernel sequence itself: a kernel that runs once per step recurs every p
    kernels; of the kernels that recur at one fixed period, the one after the longest GPU gap
    (the host's turn between steps) marks each step's start. ([], '') when nothing recurs."""
    if len(events) < 6:
        return [], ""
    names = [e.name for e in events]
    where: dict[str, list[int]] = defaultdict(list)
    for i, n in enumerate(names):
        where[n].append(i)
    periods: Counter[int] = Counter()
    regular: dict[str, int] = {}
    for n, idx in where.items():
        if len(idx) < 3:
            continue
        diffs = Counter(b - a for a, b in itertools.pairwise(idx))
        p, hits = diffs.most_common(1)[0]
        if hits >= 0.8 * (len(idx) - 1) and p > 1:
            regular[n] = p
            periods[p] += 1
    if not periods:
        return [], ""
    # the step's period: the one most once-per-step kernels share (ties: the longer)
    period = max(periods, key=lambda p: (periods[p], p))
    best, best_gap, best_run = "", -1.0, []
    for n, p in regular.items():
        if p != period:
            continue
        run = _on_grid(where[n], period)
        gaps = sorted(
            events[i].ts_us - (events[i - 1].ts_us + events[i - 1].dur_us) for i in run if i
        )
        gap = gaps[len(gaps) // 2] if gaps else 0.0  # median: one odd gap does not decide
        if gap > best_gap:
            best, best_gap, best_run = n, gap, run
    marks = [StepMark(events[i].ts_us, best) for i in best_run]
    return marks, f"periodic (every {period} kernels, starting at {best[:60]})"


def _on_grid(idx: list[int], period: int) -> list[int]:
    """The longest run of occurrences one period apart (an extra call of the kernel, e.g. in
    the tail of a partial step, is off the grid)."""
    best: list[int] = []
    run = [idx[0]]
    for a, b in itertools.pairwise(idx):
        if b - a == period:
            run.append(b)
        else:
            best = max(best, run, key=len)
            run = [b]
    return max(best, run, key=len)
