"""The doctor's capacity line (``doctor --slo``): the highest of its closed-loop concurrency
levels whose goodput met the SLOs, and the SLO that binds above it.

Why a line of its own and not ``bench --mode capacity``: the doctor already measures a short
sweep of concurrency levels (closed loop: each stream sends its next request when the previous
answer came back); with SLOs those levels have a goodput, and the deployment review's question
("how much does this serve within our targets?") gets a first answer at no extra cost. It is
not the capacity search: closed-loop levels offer no request rate of their own (the server's
pace sets it), and their count is the user's few levels, so the line names them as such and
points to ``ceiling bench --mode capacity``, which searches Poisson rates to the knee.

A level **passes** by the capacity search's rule (:func:`ceiling.bench.capacity.passed`, its
default tolerance): at least (1 - tolerance) of the requests it sent completed within every
SLO. The binding SLO is the one most requests missed at the lowest failing level above the
highest passing one (``errors`` when failed requests, not missed SLOs, failed it).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field, computed_field

from ceiling.bench.capacity import DEFAULT_TOLERANCE, binding_slo, passed
from ceiling.bench.results import LevelResult
from ceiling.result_model import ResultModel


class ClosedLoopLevel(BaseModel):
    """One concurrency level of the doctor's sweep, judged against the SLOs."""

    concurrency: int
    sent: int = Field(description="completed + failed requests")
    good_completed: int = Field(description="completed requests that met every SLO")
    request_goodput: float | None = Field(description="good_completed per second (req/s)")
    request_throughput: float | None = Field(description="completed per second (req/s)")
    passed: bool = Field(description="good_completed >= (1 - tolerance) x sent")


class ClosedLoopCapacity(ResultModel):
    """The capacity line of the doctor's verdict (module docstring)."""

    slos: list[str] = Field(description="the SLOs as written back: ttft:p99<=500ms")
    tolerance: float
    levels: list[ClosedLoopLevel] = Field(default_factory=list)
    highest_passing: int | None = Field(None, description="concurrency; None: no level passed")
    first_failing: int | None = Field(None, description="the lowest failing level above it")
    binding_slo: str | None = Field(None, description="the SLO most requests missed there")

    def _level(self, concurrency: int | None) -> ClosedLoopLevel | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def sentence(self) -> str:
        slos = ", ".join(self.slos)
        measured = ", ".join(str(lv.concurrency) for lv in self.levels)
        head = (
            f"Capacity within the SLOs ({slos}), from the doctor's closed-loop concurrency "
            f"levels {measured} (not a Poisson capacity search): "
        )
        tail = (
            f" For the request rate served within them, run `ceiling bench --mode capacity "
            f"--slo {','.join(self.slos)}`."
        )
        if not self.levels:
            return (
                f"No capacity line for the SLOs ({slos}): no concurrency level was measured "
                "(--concurrency none)." + tail
            )
        share = f"at least {1 - self.tolerance:.0%} of its requests within every SLO"
        best = self._level(self.highest_passing)
        if best is None:
            what = f"no level met them ({share})"
        else:
            rate = "–" if best.request_goodput is None else f"{best.request_goodput:.3g}"
            what = (
                f"concurrency {best.concurrency} is the highest level whose goodput met them "
                f"({share}; {rate} req/s within them)"
            )
        fail = self._level(self.first_failing)
        if fail is None:
            above = "; no measured level above it missed them, so the SLOs do not bind yet."
        else:
            missed = fail.sent - fail.good_completed
            where = "at" if best is None else "above it, at"
            above = (
                f"; {where} concurrency {fail.concurrency}, {self.binding_slo} binds "
                f"({missed} of {fail.sent} requests outside the SLOs)."
            )
        return head + what + above + tail


def closed_loop_capacity(
    levels: Sequence[LevelResult], slos: Sequence[str], tolerance: float = DEFAULT_TOLERANCE
) -> ClosedLoopCapacity:
    """The capacity line from the doctor's concurrency levels (each run with the SLOs)."""
    judged = [
        (lv, passed(lv, tolerance)) for lv in sorted(levels, key=lambda x: x.concurrency or 0)
    ]
    good = [lv.concurrency for lv, ok in judged if ok]
    top = max((c for c in good if c is not None), default=None)
    above = [lv for lv, ok in judged if not ok and (top is None or (lv.concurrency or 0) > top)]
    return ClosedLoopCapacity(
        slos=list(slos),
        tolerance=tolerance,
        levels=[
            ClosedLoopLevel(
                concurrency=lv.concurrency or 0,
                sent=lv.completed + lv.failed,
                good_completed=lv.good_completed or 0,
                request_goodput=lv.request_goodput,
                request_throughput=lv.request_throughput,
                passed=ok,
            )
            for lv, ok in judged
        ],
        highest_passing=top,
        first_failing=above[0].concurrency if above else None,
        binding_slo=binding_slo(above[0]) if above else None,
    )
