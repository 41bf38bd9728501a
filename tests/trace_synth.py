"""Synthetic torch-profiler Chrome traces for the trace tests: the event shapes Kineto writes
(kernel / cuda_runtime with correlation ids, user_annotation, cpu_op), built step by step."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Synth:
    """Builds one rank's trace. ``t`` is the host clock (us); kernels are queued on streams."""

    rank: int | None = None
    world_size: int | None = None
    t: float = 1_000.0
    events: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    _corr: int = 0

    def annotation(self, name: str, ts: float, dur: float, tid: int = 1) -> None:
        self.events.append(
            {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": tid,
             "ts": ts, "dur": dur, "args": {}}
        )  # fmt: skip

    def kernel(self, name: str, ts: float, dur: float, stream: int = 7, launch: float | None = None,
               cat: str = "kernel") -> None:  # fmt: skip
        self._corr += 1
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts,
             "dur": dur, "args": {"stream": stream, "correlation": self._corr, "device": 0}}
        )  # fmt: skip
        self.events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
             "ts": launch if launch is not None else ts - 5.0, "dur": 2.0,
             "args": {"correlation": self._corr}}
        )  # fmt: skip

    def cpu_op(self, name: str, ts: float, dur: float, tid: int = 1) -> None:
        self.events.append(
            {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts,
             "dur": dur, "args": {}}
        )  # fmt: skip

    def gpu_step(self, kernels: list[tuple[str, float]], annotation: str | None,
                 gap: float = 10.0, stream: int = 7) -> float:  # fmt: skip
        """One step: host launches, kernels back to back on ``stream`` after ``gap`` us of
        idle; the annotation (if any) spans the launches. Returns the step's GPU start."""
        start = self.t + gap
        ts = start
        for name, dur in kernels:
            self.kernel(name, ts, dur, stream=stream, launch=self.t + 1.0)
            ts += dur
        if annotation:
            self.annotation(annotation, self.t, 3.0)
        self.t = ts
        return start

    def doc(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schemaVersion": 1, "traceEvents": list(self.events), **self.meta}
        if self.rank is not None:
            d["distributedInfo"] = {"backend": "nccl", "rank": self.rank,
                                    "world_size": self.world_size or 1}  # fmt: skip
        return d

    def write(self, path: Path, gz: bool = False) -> Path:
        data = json.dumps(self.doc()).encode()
        path.write_bytes(gzip.compress(data) if gz else data)
        return path
