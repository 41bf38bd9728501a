"""``ceiling doctor --trace``: the engine's profiler on the launched variant, and a window of
steady decode steps recorded after the single-stream bench and after the concurrency sweep (one
window per level), each in its own span of requests.

Why apart from the bench: the profiler's start stalls the engine and its stop writes the files
from the engine loop, and while it records every step is slower (vLLM-CPU: about 1.5x; an H200
eager step: 1.4x), so no measured repeat may overlap a window: the bench figures are untraced,
the split is traced, and the report says which is which.

A server ceiling did not launch: the engine's adapter names the flag or variable that turns
its profiler on (``ProfilerSetup.enable_hint``); the first window's refusal is recorded once
and the doctor carries on without a trace.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Protocol

from ceiling.diagnose.schema import DoctorConfig, DoctorResult, Stage
from ceiling.engines import get_engine
from ceiling.engines.profiling import ProfilerSetup
from ceiling.engines.variant import Variant
from ceiling.errors import CeilingError
from ceiling.trace.capture import TraceCapture, capture_window, engine_steps

TRACE_DIR = "traces"


class _Recorder(Protocol):
    def stage(self, name: str, fatal: bool = False) -> contextlib.AbstractContextManager[Stage]: ...

    def skip(self, name: str, why: str) -> None: ...


def traced_variant(variant: Variant, cfg: DoctorConfig, out: Path) -> tuple[Variant, ProfilerSetup]:
    """``variant`` with its engine's profiler settings (for the installed version) added, and
    the setup that finds the files where the variant's own settings send them."""
    engine = get_engine(variant.engine)
    version = None
    with contextlib.suppress(CeilingError):  # preflight says what is wrong with the install
        version = engine.locate(variant).version
    setup = engine.profiler(
        version, out / TRACE_DIR, engine_steps(cfg.trace_steps), prefix="doctor"
    )
    # a variant that sets the profiler itself keeps its directory: the files are read there
    setup = setup.for_variant(variant)
    return setup.apply(variant), setup


def ranks_of(variant: Variant | None) -> int:
    """Trace files to wait for: one per tensor-parallel rank of a launched variant (a server
    ceiling did not launch: the first file to appear)."""
    if variant is None:
        return 1
    with contextlib.suppress(CeilingError):
        return get_engine(variant.engine).tensor_parallel(variant)
    return 1


def unlaunched_setup(engine_name: str | None, cfg: DoctorConfig, out: Path) -> ProfilerSetup:
    """The profiler of a server ceiling did not launch (version unknown: the newest form)."""
    try:
        engine = get_engine(engine_name or "")
    except CeilingError:
        return ProfilerSetup(
            engine=engine_name or "unknown",
            supported=False,
            enable_hint=f"engine {engine_name or 'unknown'!r}: ceiling knows no profiler of it "
            "(pass --engine vllm|sglang)",
        )
    return engine.profiler(None, out / TRACE_DIR, engine_steps(cfg.trace_steps), prefix="doctor")


def trace_windows(
    rec: _Recorder,
    res: DoctorResult,
    cfg: DoctorConfig,
    setup: ProfilerSetup,
    url: str,
    served: str | None,
    mode: str,
    ranks: int = 1,
) -> None:
    """The windows after bench stage ``mode``: one stream after ``single``, each concurrency
    level's streams after ``concurrency``. Stops at the first refusal (said once)."""
    if res.server_died or mode not in res.bench:
        return
    if any(t.why_not and not t.recorded for t in res.traces):
        return  # already refused: said once, the doctor goes on without a trace
    levels = [1] if mode == "single" else list(cfg.concurrency)
    extra = {}
    ignore = get_engine(setup.engine).ignore_eos_field if setup.supported else None
    if ignore:
        extra[ignore] = True
    for streams in levels:
        label = "single" if mode == "single" else f"concurrency {streams}"
        with rec.stage(f"trace {label}") as st:
            cap = capture_window(
                url,
                served or "",
                setup,
                cfg.trace_steps,
                streams=streams,
                ranks=ranks,
                label=label,
                extra_body=extra,
            )
            res.traces.append(cap)
            st.message = _message(cap)
            if not cap.recorded:
                st.status = "skipped"
                return


def _message(cap: TraceCapture) -> str:
    if not cap.recorded or cap.split is None:
        return f"no trace: {cap.why_not}"
    sp = cap.split
    vs = (
        f", engine ITL {cap.engine_itl_ms:.3g} ms ({cap.step_vs_engine_pct:+.3g} %)"
        if cap.engine_itl_ms is not None and cap.step_vs_engine_pct is not None
        else ""
    )
    return (
        f"{sp.steps} steps of {sp.step_ms:.3g} ms, {sp.coverage * 100:.3g} % classified, "
        f"idle {sp.idle_ms:.3g} ms{vs}; {len(cap.files)} file(s)"
    )
