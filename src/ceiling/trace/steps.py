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
    any annotation matches; ([], '') when none does.

    On a CPU trace a step starts at its annotation. On a GPU a step starts when the host has
    begun it and the GPU has finished the step before: at the later of the annotation's start
    and the end of the last activity launched in the previous step (everything launched from
    one annotation's start to the next one's: sampling after ``execute_model`` too), but never
    after the step's own first activity. A host-bound step then counts the host's time before
    its first kernel as idle; a GPU-bound step (the host ran ahead) starts where the GPU turns
    to it. Kineto puts GPU activity on the host's clock, so the two compare."""
    for rx, pat in cls.step_patterns():
        chosen = [(a, m) for a in annotations if (m := rx.match(a.name)) is not None]
        if not chosen:
            continue
        chosen.sort(key=lambda am: am[0].ts_us)
        launch = _launch_index(events) if gpu else None
        marks: list[StepMark] = []
        prev_end = _ended_before(events, launch, chosen[0][0].ts_us) if gpu else None
        for k, (a, m) in enumerate(chosen):
            groups = m.groupdict()
            decode = str(groups.get("context") or "0") == "0"
            end_hint = a.ts_us + a.dur_us
            if not gpu:
                marks.append(StepMark(a.ts_us, a.name, decode, end_hint, groups))
                continue
            nxt = chosen[k + 1][0].ts_us if k + 1 < len(chosen) else float("inf")
            first, last = _launched(events, launch, a.ts_us, nxt)
            if first is None:
                continue  # an annotation that launched nothing on the GPU (an empty step)
            start = a.ts_us if prev_end is None else max(a.ts_us, prev_end)
            marks.append(StepMark(min(first, start), a.name, decode, max(end_hint, last), groups))
            prev_end = last
        return marks, f"{pat.name} annotations"
    return [], ""


def _launch_index(events: list[KernelEvent]) -> tuple[list[float], list[int]] | None:
    pairs = sorted((e.launch_ts_us, i) for i, e in enumerate(events) if e.launch_ts_us is not None)
    if not pairs:
        return None
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _launched(
    events: list[KernelEvent],
    index: tuple[list[float], list[int]] | None,
    lo_us: float,
    hi_us: float,
) -> tuple[float | None, float]:
    """(first start, last end) of the GPU activity launched in [lo, hi); without launch
    records, of the activity that starts in it."""
    if index is None:
        chosen = [e for e in events if lo_us <= e.ts_us < hi_us]
    else:
        ts, idx = index
        chosen = [events[idx[j]] for j in range(bisect_left(ts, lo_us), bisect_left(ts, hi_us))]
    if not chosen:
        return None, lo_us
    return min(e.ts_us for e in chosen), max(e.end_us for e in chosen)


def _ended_before(
    events: list[KernelEvent], index: tuple[list[float], list[int]] | None, t_us: float
) -> float | None:
    """When the GPU finished what was launched before ``t_us`` (the step before the first
    annotation), None when nothing was."""
    _, last = _launched(events, index, float("-inf"), t_us)
    return last if last != float("-inf") else None


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
    regular: dict[str, int] = {}
    for n, idx in where.items():
        if len(idx) < 3:
            continue
        diffs = Counter(b - a for a, b in itertools.pairwise(idx))
        p, hits = diffs.most_common(1)[0]
        # a kernel at a fixed period over at least half the trace (not a warm-up burst)
        if hits >= 0.8 * (len(idx) - 1) and p > 1 and p * (len(idx) - 1) >= 0.5 * len(names):
            regular[n] = p
    if not regular:
        return [], ""
    # per-layer kernels recur every layer; the kernels that run once per step (embedding,
    # lm_head, argmax) recur every step: the longest such period is the step's
    period = max(regular.values())
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
