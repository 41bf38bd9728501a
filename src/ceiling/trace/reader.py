"""Read one rank's torch-profiler Chrome trace (``.json`` or ``.json.gz``) into a RankTrace.

Parser choice (experiments/validation/trace_parse.py measures it): the whole file decoded by orjson
(C, ~1 GB/s) and then one pass over the events in Python beats a streaming reader (ijson's C
backend still builds a Python object per event, several times slower on the same file) and
HolisticTraceAnalysis (pandas frames of every event, seconds more and a large dependency).
The stdlib ``json`` module is the fallback when orjson is absent (about 2x slower).
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any, BinaryIO

from ceiling.errors import CeilingError
from ceiling.inputs import open_regular, size_text, too_large
from ceiling.trace.schema import Annotation, EventKind, KernelEvent, RankTrace

try:  # orjson is a dependency; the stdlib parser keeps a broken install working, slower
    import orjson as _orjson

    def _loads(data: bytes) -> Any:
        return _orjson.loads(data)

except ImportError:  # pragma: no cover - the dependency is installed
    import json as _json

    def _loads(data: bytes) -> Any:
        return _json.loads(data)


#: Kineto categories of GPU activities and what ceiling calls them
_GPU_KINDS: dict[str, EventKind] = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
}
#: host-side launch records: their correlation id links them to the GPU activity they started
_LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver"})
#: the trace's file name often carries the rank (vLLM: ..._rank0..., SGLang: -TP-1)
_RANK_IN_NAME = re.compile(r"(?:rank|TP-|tp|-r)[_-]?(\d+)", re.IGNORECASE)
_FIX = "pass a trace written by the torch profiler (export_chrome_trace, .json or .json.gz)"


#: The most ceiling reads of one trace file, and the most a gzip trace may expand to. Traces are
#: legitimately large (a few hundred MB of JSON for a long window on 8 ranks), well over the
#: 256 MiB every other input gets, but a path to /dev/zero or a gzip bomb must not grow the
#: process until the kernel kills it.
MAX_TRACE_BYTES = 2 << 30
#: The first bytes a trace can start with: gzip's magic, or JSON's object or array.
_GZIP = b"\x1f\x8b"
_JSON_START = (b"{", b"[")


def trace_bytes(p: Path) -> bytes:
    """The trace's JSON bytes: a regular file (inputs.open_regular), gzip or plain, neither
    the file nor what it expands to over :data:`MAX_TRACE_BYTES`. A file that starts like
    neither gzip nor JSON is refused on its first bytes, not read whole."""
    limit = MAX_TRACE_BYTES
    with open_regular(p, "trace", _FIX, max_size=limit) as fh:
        try:
            head = fh.read(64)
            if head[:2] == _GZIP:
                fh.seek(0)
                return _gunzip(p, fh, limit)
            start = head.lstrip()[:1]
            if start and start not in _JSON_START:
                raise CeilingError(
                    f"trace {p} is not a torch-profiler trace (neither gzip nor JSON: "
                    f"starts with {head[:8]!r})",
                    fix=_FIX,
                )
            raw = head + fh.read(limit + 1 - len(head))
        except OSError as exc:
            raise CeilingError(f"trace {p} cannot be read: {exc.strerror}", fix=_FIX) from None
    if len(raw) > limit:  # it grew while it was read
        raise too_large(p, "trace", _FIX, limit)
    return raw


def _gunzip(p: Path, fh: BinaryIO, limit: int) -> bytes:
    try:
        data = gzip.GzipFile(fileobj=fh, mode="rb").read(limit + 1)
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise CeilingError(f"trace {p} is not a complete gzip file ({exc})", fix=_FIX) from None
    if len(data) > limit:
        raise CeilingError(
            f"trace {p} expands to more than {size_text(limit)} of JSON: not a trace ceiling "
            "reads (a gzip bomb, or a window far longer than needed)",
            fix="record a shorter window (trace capture --steps) or " + _FIX,
        )
    return data


def read_trace(path: str | Path) -> RankTrace:
    """One rank's trace: GPU kernels/copies/fills with their launch times, or (no GPU
    activity) the top-level CPU operators of every thread; the profiler's annotations."""
    p = Path(path)
    data = trace_bytes(p)
    try:
        doc = _loads(data)
    except ValueError as exc:
        raise CeilingError(f"trace {p} is not JSON ({exc})", fix=_FIX) from exc
    if isinstance(doc, list):  # the bare-array form of the Chrome trace format
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise CeilingError(f"trace {p} has no traceEvents list", fix=_FIX)
    return _build(p, doc)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _int(v: Any, default: int = 0) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lstrip("-").isdigit():
        return int(v)
    return default


def _build(p: Path, doc: dict[str, Any]) -> RankTrace:
    gpu: list[tuple[str, float, float, EventKind, int, int | None, int]] = []
    launches: dict[int, float] = {}
    cpu_ops: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    notes: list[str] = []
    annotations: list[Annotation] = []
    bad = 0
    for ev in doc["traceEvents"]:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        ts, dur = _num(ev.get("ts")), _num(ev.get("dur"))
        if ts is None or dur is None or dur < 0:
            bad += 1
            continue
        args = ev.get("args")
        if not isinstance(args, dict):
            args = {}
        if cat in _GPU_KINDS:
            corr = args.get("correlation")
            gpu.append(
                (
                    str(ev.get("name", "")),
                    ts,
                    dur,
                    _GPU_KINDS[cat],
                    _int(args.get("stream")),
                    corr if isinstance(corr, int) else None,
                    _int(args.get("device")),
                )
            )
        elif cat in _LAUNCH_CATS:
            corr = args.get("correlation")
            if isinstance(corr, int):
                launches[corr] = ts
        elif cat == "cpu_op":
            cpu_ops[_int(ev.get("tid"))].append((ts, dur, str(ev.get("name", ""))))
        elif cat == "user_annotation":
            annotations.append(
                Annotation(
                    name=str(ev.get("name", "")), ts_us=ts, dur_us=dur, thread=_int(ev.get("tid"))
                )
            )
    if bad:
        notes.append(f"{bad} events without a start or a duration were skipped")
    annotations.sort(key=lambda a: a.ts_us)
    raw_info = doc.get("distributedInfo")
    info: dict[str, Any] = raw_info if isinstance(raw_info, dict) else {}
    rank = info.get("rank") if isinstance(info.get("rank"), int) else None
    if rank is None:
        m = _RANK_IN_NAME.search(p.name)
        rank = int(m.group(1)) if m else None
    world = info.get("world_size") if isinstance(info.get("world_size"), int) else None
    hint, version = _engine_of(doc)
    trace = RankTrace(
        path=str(p),
        rank=rank,
        world_size=world,
        engine_hint=hint,
        engine_version=version,
        annotations=annotations,
        notes=notes,
    )
    if gpu:
        gpu.sort(key=lambda e: e[1])
        trace.device = "gpu"
        trace.events = [
            KernelEvent.model_construct(
                name=n,
                ts_us=ts,
                dur_us=d,
                kind=k,
                stream=s,
                correlation=c,
                launch_ts_us=launches.get(c) if c is not None else None,
                device=dev,
            )
            for n, ts, d, k, s, c, dev in gpu
        ]
        return trace
    trace.device = "cpu"
    events, nested = _top_level(cpu_ops)
    trace.events = events
    trace.nested_ops_skipped = nested
    return trace


def _top_level(
    by_thread: dict[int, list[tuple[float, float, str]]],
) -> tuple[list[KernelEvent], int]:
    """CPU operators that no other operator of the same thread encloses (their children's time
    is inside theirs: counting both would count it twice)."""
    out: list[KernelEvent] = []
    nested = 0
    for tid, ops in by_thread.items():
        ops.sort(key=lambda o: (o[0], -o[1]))
        end = float("-inf")
        for ts, dur, name in ops:
            # a child starts at or after its parent and ends by its end; the profiler's
            # microsecond rounding can put a child's end a hair past it
            if ts < end:
                nested += 1
                continue
            out.append(
                KernelEvent.model_construct(
                    name=name,
                    ts_us=ts,
                    dur_us=dur,
                    kind="cpu_op",
                    stream=tid,
                    correlation=None,
                    launch_ts_us=None,
                    device=0,
                )
            )
            end = ts + dur
    out.sort(key=lambda e: e.ts_us)
    return out, nested


def _engine_of(doc: dict[str, Any]) -> tuple[str | None, str | None]:
    """The engine a trace names itself (vLLM stamps ``vllm_version`` into its traces:
    vllm/profiler/wrapper.py, TorchProfilerWrapper._maybe_add_version_metadata)."""
    v = doc.get("vllm_version")
    if v is not None:
        return "vllm", str(v).strip('"')
    for key in ("sglang_version", "sglang"):
        if key in doc:
            return "sglang", str(doc[key]).strip('"')
    return None, None
