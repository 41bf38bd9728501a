"""Measured split of an engine's decode step from its own profiler trace (issue 23).

    read_trace(path) -> RankTrace            one rank's torch-profiler Chrome trace
    split(traces, engine, window) -> TraceSplit   per step: op classes + idle == step
    to_profile(split, ...) -> HardwareProfile     the trace's op times as predict evidence

Kernel-name tables are data: ``ceiling/engines/data/trace/*.yaml`` (docs/trace.md).
"""

from __future__ import annotations

from ceiling.trace.reader import read_trace
from ceiling.trace.schema import (
    SCHEMA_VERSION,
    ClassTime,
    KernelEvent,
    KernelStat,
    OverlapNote,
    RankSplit,
    RankTrace,
    TraceSplit,
    Unmatched,
)
from ceiling.trace.split import split

__all__ = [
    "SCHEMA_VERSION",
    "ClassTime",
    "KernelEvent",
    "KernelStat",
    "OverlapNote",
    "RankSplit",
    "RankTrace",
    "TraceSplit",
    "Unmatched",
    "read_trace",
    "split",
]
