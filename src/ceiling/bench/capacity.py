"""``ceiling bench --mode capacity``: the highest request rate a server serves within its SLOs.

A level is an open-loop run at one Poisson rate (gamma gaps with ``--burstiness``, 1 by
default). It **passes** when its goodput stays at or above the rate it offered times
(1 - tolerance): ``good_completed >= (1 - tolerance) x sent``, both counted over the level's
one duration (send start to last answer), so the comparison does not depend on how many
arrivals one Poisson sample happened to put into that span.

**Steady state (the rule)**: a level sends ``max(--requests, ceil(rate x --duration))``
requests (defaults 200 and 30 s). Above the server's capacity its queue grows by
(rate - capacity) requests every second; over at least 30 s and 200 arrivals that queue
reaches the SLOs' bar unless they tolerate that much, and below capacity the waits settle
within the first requests. Shorter levels (tests) find a knee that drifts above the true
one: an overload too short to show.

**Search**: from ``--rate`` (default 1 req/s) the rate doubles while levels pass (halves while
they fail), which brackets the knee between a passing and a failing rate; then bisection
until the bracket is within ``--precision`` (default 2 %) of the passing rate, or
``MAX_LEVELS`` levels. The knee is the highest passing rate; the SLO that binds it is the one
most requests missed at the lowest failing rate above it (``errors`` when failed requests,
not missed SLOs, failed that level). The curve is every level, by rate.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

from ceiling.bench.results import CapacityPoint, CapacityResult, LevelResult

#: Levels at most in one search (a runaway bracket on a server whose answers drift).
MAX_LEVELS = 24
#: Halvings at most below the start rate before the search gives up (even that rate fails).
MAX_HALVINGS = 10
DEFAULT_START_RATE = 1.0
DEFAULT_LEVEL_REQUESTS = 200
DEFAULT_LEVEL_SECONDS = 30.0
DEFAULT_TOLERANCE = 0.05
DEFAULT_PRECISION = 0.02


def level_requests(rate: float, min_requests: int, min_seconds: float) -> int:
    """Requests one level sends at ``rate`` (the steady-state rule in the module docstring)."""
    return max(min_requests, math.ceil(rate * min_seconds))


def passed(level: LevelResult, tolerance: float) -> bool:
    """The level's goodput kept up with the rate it offered, within the tolerance."""
    sent = level.completed + level.failed
    return sent > 0 and (level.good_completed or 0) >= (1.0 - tolerance) * sent


class Bracket:
    """The search's state: doubling (or halving) until bracketed, then bisection."""

    def __init__(self, start: float, precision: float) -> None:
        self.start, self.precision = start, precision
        self.lo: float | None = None  # highest passing rate
        self.hi: float | None = None  # lowest failing rate
        self.next: float | None = start

    def record(self, rate: float, ok: bool) -> float | None:
        """Take one level's outcome; return the next rate to try (None: done)."""
        if ok:
            self.lo = rate if self.lo is None else max(self.lo, rate)
        else:
            self.hi = rate if self.hi is None else min(self.hi, rate)
        if self.lo is None:
            assert self.hi is not None
            low_end = self.start / 2**MAX_HALVINGS
            self.next = self.hi / 2 if self.hi / 2 >= low_end else None
        elif self.hi is None:
            self.next = self.lo * 2
        elif self.hi <= self.lo * (1.0 + self.precision):
            self.next = None
        else:
            self.next = (self.lo + self.hi) / 2
        return self.next


def binding_slo(level: LevelResult) -> str | None:
    """The SLO most requests of a failing level missed (``errors``: failed requests did it)."""
    worst = max(level.slo, key=lambda c: c.missed_requests, default=None)
    if worst is not None and worst.missed_requests > 0:
        return worst.slo
    return "errors" if level.failed else None


def _point(level: LevelResult, rate: float, ok: bool) -> CapacityPoint:
    return CapacityPoint(
        rate=rate,
        sent=level.completed + level.failed,
        good_completed=level.good_completed or 0,
        request_goodput=level.request_goodput,
        request_throughput=level.request_throughput,
        passed=ok,
        slo=level.slo,
    )


async def search(
    measure: Callable[[float, int], Awaitable[LevelResult | None]],
    *,
    start: float = DEFAULT_START_RATE,
    tolerance: float = DEFAULT_TOLERANCE,
    precision: float = DEFAULT_PRECISION,
    min_requests: int = DEFAULT_LEVEL_REQUESTS,
    min_seconds: float = DEFAULT_LEVEL_SECONDS,
) -> tuple[list[LevelResult], CapacityResult]:
    """Run the bracketing search; ``measure(rate, requests)`` runs one level (None: the run
    was stopped, e.g. Ctrl-C or a dead server). Returns the levels by rate and the result."""
    bracket = Bracket(start, precision)
    tried: list[tuple[float, LevelResult, bool]] = []
    rate: float | None = start
    stopped = ""
    while rate is not None:
        if len(tried) >= MAX_LEVELS:
            stopped = f"{MAX_LEVELS} levels without bracketing within {precision:.0%}"
            break
        level = await measure(rate, level_requests(rate, min_requests, min_seconds))
        if level is None:
            stopped = "the run was stopped before the search ended"
            break
        ok = passed(level, tolerance)
        tried.append((rate, level, ok))
        rate = bracket.record(rate, ok)
    if not stopped:
        if bracket.lo is None:
            stopped = f"even {bracket.hi:g} req/s missed the SLOs" if bracket.hi else "no level"
        else:
            stopped = f"bracketed within {precision:.0%}"
    tried.sort(key=lambda t: t[0])
    above = [t for t in tried if not t[2] and (bracket.lo is None or t[0] > bracket.lo)]
    rule = (
        f"each level sent max({min_requests}, ceil(rate x {min_seconds:g} s)) Poisson-timed "
        "requests; a level passes when good_completed >= "
        f"{1 - tolerance:.3g} x the requests it sent"
    )
    result = CapacityResult(
        knee_rate=bracket.lo,
        first_failing_rate=above[0][0] if above else None,
        binding_slo=binding_slo(above[0][1]) if above else None,
        tolerance=tolerance,
        precision=precision,
        level_rule=rule,
        stopped=stopped,
        curve=[_point(lv, r, ok) for r, lv, ok in tried],
    )
    return [lv for _, lv, _ in tried], result
