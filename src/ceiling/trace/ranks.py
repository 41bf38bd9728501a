"""Several ranks of one recording: each rank's accounting (summed over its counted steps),
the waiting inside collectives apart from the transfer, the slowest rank, missing ranks."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ceiling.trace.schema import CollectiveWait, RankSplit, RankTrace, StepTime


@dataclass
class RankAccount:
    """One rank's accounting, summed over its counted steps."""

    trace: RankTrace
    steps: list[StepTime] = field(default_factory=list)
    cls_us: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    cls_calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    cls_impl: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    name_us: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    name_own_us: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    name_calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    hidden: dict[tuple[int, str], float] = field(default_factory=lambda: defaultdict(float))
    side_own: dict[tuple[int, str], float] = field(default_factory=lambda: defaultdict(float))
    side_names: dict[tuple[int, str], dict[str, float]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(float))
    )
    # per counted step: the collectives' own durations, in order
    coll: list[list[tuple[str, float]]] = field(default_factory=list)
    # per counted step: the main stream's GEMM calls in order, us (split-K halves joined)
    gemm_calls: list[list[float]] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    source: str = ""
    notes: list[str] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)  # sequences per counted step
    contexts: list[float] = field(default_factory=list)  # mean context per counted step
    wait_us: dict[str, float] | None = None  # collectives: waiting for the slowest rank
    matched_steps: int = 0  # steps whose collectives matched across ranks

    @property
    def n(self) -> int:
        return len(self.steps)

    def step_ms(self) -> float:
        return sum(s.ms for s in self.steps) / self.n if self.n else 0.0


def skew(ranks: list[RankAccount]) -> dict[str, float]:
    """Waiting inside collectives: the i-th collective of step k is the same call on every
    rank; the rank that arrives last waits least, so the shortest duration among ranks is the
    transfer and each rank's excess over it is time spent waiting for the slowest rank.
    Returns the transfer time (us, summed over the matched steps) per collective class."""
    transfer: dict[str, float] = defaultdict(float)
    if len(ranks) < 2:
        return transfer
    n = min(r.n for r in ranks)
    if any(r.n != n for r in ranks):
        ranks[0].notes.append(
            f"ranks counted different numbers of steps ({', '.join(str(r.n) for r in ranks)}): "
            f"collectives matched over the first {n}"
        )
    for r in ranks:
        r.wait_us = defaultdict(float)
    mismatched = 0
    for k in range(n):
        calls = [r.coll[k] for r in ranks]
        if len({len(c) for c in calls}) != 1:
            mismatched += 1
            continue
        for i in range(len(calls[0])):
            durs = [c[i][1] for c in calls]
            fastest = min(durs)
            transfer[calls[0][i][0]] += fastest
            for r, c in zip(ranks, calls, strict=True):
                assert r.wait_us is not None
                r.wait_us[c[i][0]] += c[i][1] - fastest
    if mismatched:
        ranks[0].notes.append(
            f"{mismatched} step(s) ran different numbers of collectives on different ranks: "
            "their waiting is not measured"
        )
    for r in ranks:
        r.matched_steps = n - mismatched
    return transfer


def waits(ranks: list[RankAccount], transfer: dict[str, float]) -> list[CollectiveWait]:
    """Per collective class across the ranks: the transfer, and how long ranks waited for the
    slowest one (mean and worst), all per step."""
    out = []
    for op, t_us in sorted(transfer.items(), key=lambda kv: -kv[1]):
        per = [
            (r.trace.rank, (r.wait_us or {}).get(op, 0.0) / r.matched_steps / 1e3)
            for r in ranks
            if r.matched_steps
        ]
        if not per:
            continue
        worst = max(per, key=lambda x: x[1])
        out.append(
            CollectiveWait(
                op_class=op,
                transfer_ms=round(t_us / ranks[0].matched_steps / 1e3, 6),
                wait_ms_mean=round(sum(w for _, w in per) / len(per), 6),
                wait_ms_max=round(worst[1], 6),
                most_waiting_rank=worst[0],
            )
        )
    return out


def slowest(ranks: list[RankAccount]) -> RankAccount:
    """The rank the others wait for: ranks in lockstep share one step time, so where the
    collectives' waiting was measured it is the rank that waited least (it arrived last);
    otherwise the one with the longest mean step."""
    waited = [r for r in ranks if r.wait_us is not None and r.matched_steps]
    if len(ranks) > 1 and len(waited) == len(ranks):
        return min(ranks, key=lambda r: (sum((r.wait_us or {}).values()), -r.step_ms()))
    return max(ranks, key=lambda r: r.step_ms())


def missing(traces: list[RankTrace]) -> list[int]:
    world = max((t.world_size or 0) for t in traces)
    have = {t.rank for t in traces if t.rank is not None}
    if world <= 1 or not have:
        return []
    return [r for r in range(world) if r not in have]


def rank_split(r: RankAccount) -> RankSplit:
    n = r.n or 1
    wait, matched = r.wait_us, r.matched_steps
    return RankSplit(
        rank=r.trace.rank,
        path=r.trace.path,
        device=r.trace.device,
        step_ms=round(r.step_ms(), 6),
        idle_ms=round(sum(s.idle_ms for s in r.steps) / n, 6),
        steps=r.n,
        classes={k: round(v / n / 1e3, 6) for k, v in sorted(r.cls_us.items())},
        collective_wait_ms=round(sum(wait.values()) / matched / 1e3, 6)
        if wait is not None and matched
        else None,
    )
