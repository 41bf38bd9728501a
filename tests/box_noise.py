"""When a truth test on a real engine may be rerun: only when the box itself says it swamped the
effect the test reads, never on a failed assertion.

The doctor's truth tests (tests/engine/test_doctor_*_vllm.py) read effects (batches,
preemptions, a starved API server, a no-op change) out of a real engine on a shared 2-core box.
Where the test can measure that the box got in the way (the starver could not stop the API
server most of the time; the box's own CPU use drifted between the two sides of a comparison),
it raises :class:`BoxTooNoisy` with that measurement, and only that is rerun
(:data:`RERUN_WHEN_SWAMPED`). The bench's timing test (tests/test_bench_timing.py) does the same
with :class:`RunQueueWait`: how long the box kept its client and server waiting for a CPU. An ``AssertionError`` or any other exception, from the test or
from the library, fails at once: a rerun on those could hide a library bug that fails one run in
two. tests/test_rerun_policy.py checks both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest


class BoxTooNoisy(Exception):
    """The box's own measurement says its load swamped the effect this run was to read."""


def swamped_if(condition: bool, measured: str) -> None:
    """Raise :class:`BoxTooNoisy` (``measured``: what the box measured) when ``condition``."""
    if condition:
        raise BoxTooNoisy(measured)


def rerun_when_swamped(reruns: int = 1) -> pytest.MarkDecorator:
    """The flaky marker of these modules: reruns only for :class:`BoxTooNoisy` (the class
    itself, matched with isinstance, not a pattern an assertion message could contain)."""
    return pytest.mark.flaky(reruns=reruns, only_rerun=[BoxTooNoisy])


RERUN_WHEN_SWAMPED = rerun_when_swamped(1)


@dataclass(frozen=True)
class CpuTimes:
    """The box's CPU time so far (all cores, every process: the other tenants' load too)."""

    busy: int
    total: int

    @classmethod
    def now(cls) -> CpuTimes:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        idle = fields[3] + fields[4]  # idle + iowait
        return cls(busy=sum(fields) - idle, total=sum(fields))

    def busy_share_since(self, earlier: CpuTimes) -> float:
        """The share of the box's CPU time in use between ``earlier`` and this sample."""
        total = self.total - earlier.total
        return (self.busy - earlier.busy) / total if total > 0 else 0.0


@dataclass(frozen=True)
class RunQueueWait:
    """How long processes' threads were runnable but not running so far (``/proc/PID/task/*/
    schedstat``, second field): time the box's other load kept *these* processes off a CPU.
    Processes the kernel does not report on (no schedstat, or gone) count as 0 (no evidence)."""

    ns: dict[int, int]

    @classmethod
    def now(cls, *pids: int) -> RunQueueWait:
        out = {}
        for pid in pids:
            total = 0
            for f in Path(f"/proc/{pid}/task").glob("*/schedstat"):
                try:
                    total += int(f.read_text().split()[1])
                except (OSError, IndexError, ValueError):
                    continue  # a thread that ended between the listing and the read
            out[pid] = total
        return cls(ns=out)

    def ms_since(self, earlier: RunQueueWait) -> dict[int, float]:
        """Each process's run-queue wait (ms) between ``earlier`` and this sample."""
        return {pid: (ns - earlier.ns.get(pid, ns)) / 1e6 for pid, ns in self.ns.items()}
