"""``ceiling doctor --trace``: the engine's profiler on the launched variant, and a window of
steady decode steps recorded after the single-stream bench and after the concurrency sweep (one
window per level), each in its own span of requests.

Why apart from the bench: the profiler's start stalls the engine and its stop writes the files
from the engine loop, and while it records every step is slower (vLLM-CPU: about 1.5x; an H200
eager step: 1.4x), so no measured repeat may overlap a window: the bench figures are untraced,
the split is traced, and the report says which is which.

A server ceiling did not launch: the engine's adapter names the flag or variable that turns
its profiler on (``ProfilerSetup.enable_hint``) in the form for the version the server
reports (vLLM: ``GET /version``); the first window's refusal is recorded once and the doctor carries on without a trace.

The single-stream window then feeds predict (``feed_predict``): its split becomes a profile
(``trace-profile.json``, evidence source ``trace``) and the prediction is made again with it, so
the what-ifs and the expected step on this box use the engine's own kernel times.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from ceiling.diagnose.measured import measured_step
from ceiling.diagnose.schema import DoctorConfig, DoctorResult, Stage, TracedOp, TraceEvidence
from ceiling.engines import get_engine
from ceiling.engines.profiling import ProfilerSetup
from ceiling.engines.variant import Variant
from ceiling.errors import CeilingError
from ceiling.flows.target import server_version
from ceiling.predict.api import predict
from ceiling.predict.schema import Prediction
from ceiling.spec.profile import save_profile
from ceiling.trace.capture import TraceCapture, capture_window, engine_steps
from ceiling.trace.profile import to_profile

TRACE_DIR = "traces"
TRACE_PROFILE = "trace-profile.json"


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


def unlaunched_setup(
    engine_name: str | None,
    cfg: DoctorConfig,
    out: Path,
    url: str | None = None,
    log_args: Mapping[str, Any] | None = None,
) -> ProfilerSetup:
    """The profiler of a server ceiling did not launch, in the form for the version the server
    reports where its engine says one (vLLM: ``GET /version``); else the newest form. Where
    the server's start-up log names its own trace directory (``log_args``: its non-default
    arguments), the files are looked for there: the server writes where it was told."""
    try:
        engine = get_engine(engine_name or "")
    except CeilingError:
        return ProfilerSetup(
            engine=engine_name or "unknown",
            supported=False,
            enable_hint=f"engine {engine_name or 'unknown'!r}: ceiling knows no profiler of it "
            "(pass --engine vllm|sglang)",
        )
    # the engine adapter names the endpoint (not diagnose): None where the engine has none
    path = engine.version_path
    version = server_version(url, path) if url and path else None
    setup = engine.profiler(
        version, out / TRACE_DIR, engine_steps(cfg.trace_steps), prefix="doctor"
    )
    own = engine.profiler_dir_of(log_args or {})
    if own is None or not setup.supported:
        return setup
    notes = [
        *setup.notes,
        f"trace files read from {own} (the server's own profiler directory, from its log)",
    ]
    return setup.model_copy(update={"trace_dir": own, "notes": notes})


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


def feed_predict(rec: _Recorder, res: DoctorResult, out: Path) -> None:
    """The single-stream window's split as predict evidence: written to ``out/trace-profile.json``
    and the prediction made again with it (its what-ifs included), so that the expected step on
    this box uses the engine's own kernel times. Nothing without a recorded window; a
    prediction with no per-op expected side (a CPU's floors) gets the file only."""
    win = next((t for t in res.traces if t.recorded and t.label == "single" and t.split), None)
    before = res.prediction
    if win is None or win.split is None or before is None:
        return
    with rec.stage("predict (the trace's ops)") as st:
        # the window ran one stream at the bench's context: predict's request says both
        req = before.request
        prof = to_profile(win.split, batch=req.batch, context=win.split.context or req.context)
        untraced = _untraced_host(res, win.split.busy_ms, win.split.step_ms)
        if untraced is not None:  # the profiler's own cost kept out of predict's host op
            for t in prof.trace_ops:
                if t.op_class == "idle":
                    t.ms_per_step = round(untraced[0], 6)
            prof.notes.append(untraced[1])
            res.assumptions.append(untraced[1])
        path = out / TRACE_PROFILE
        save_profile(prof, path)  # atomic: complete or absent
        res.files["trace_profile"] = str(path)
        if before.expected is None:
            res.trace_evidence = TraceEvidence(
                profile=str(path),
                notes=[f"predict gave {before.kind} only: no per-op expected time to replace"],
            )
            st.message = f"{TRACE_PROFILE} written; {res.trace_evidence.notes[0]}"
            return
        after = predict(req.model_copy(update={"profile": str(path)}))
        # the measured split sets the trace against the model's own figures, not against
        # themselves: the model's prediction is kept for it; what-ifs use the trace-fed one
        res.model_prediction, res.prediction = before, after
        ev = _evidence(before, after, str(path))
        res.trace_evidence = ev
        st.message = (
            f"{len(ev.from_trace)} op(s) timed by the trace, {len(ev.kept)} kept their evidence"
            + (
                f"; expected step {ev.step_ms_before:.4g} -> {ev.step_ms:.4g} ms"
                if ev.step_ms_before is not None and ev.step_ms is not None
                else ""
            )
        )
        res.assumptions.append(
            "ops timed by the engine's own trace (single-stream window, "
            f"{TRACE_PROFILE}): {', '.join(ev.from_trace) or 'none'}; kept their previous "
            f"evidence: {', '.join(ev.kept) or 'none'}"
        )


def _untraced_host(res: DoctorResult, busy_ms: float, step_ms: float) -> tuple[float, str] | None:
    """The host time (GPU idle) of the untraced step: the bench's single-stream step less the
    traced kernel time, when the traced step is the longer one. Why: the profiler's cost lands
    mostly in the host's time between kernels (vLLM-CPU 3.5 -> 5.3 ms a step, an H200 eager
    step 1.4x), so the traced idle would put the profiler itself into predict's ``host``
    op. Assumes the kernels run as fast traced as untraced."""
    bench = measured_step(res.bench.get("single"))
    if bench is None or bench.step_ms <= 0 or step_ms <= bench.step_ms:
        return None
    host = max(0.0, bench.step_ms - busy_ms)
    return host, (
        f"trace idle: {step_ms - busy_ms:.4g} ms of the traced {step_ms:.4g} ms step, taken as "
        f"{host:.4g} ms (the untraced bench step {bench.step_ms:.4g} ms less the traced kernel "
        f"time {busy_ms:.4g} ms): the profiler's cost is the host's, the kernels' assumed equal"
    )


def _evidence(before: Prediction, after: Prediction, path: str) -> TraceEvidence:
    was = {o.name: o for o in (before.expected.ops if before.expected else [])}
    ops = [
        TracedOp(
            name=o.name,
            source_before=was[o.name].source if o.name in was else "",
            ms_before=was[o.name].ms if o.name in was else 0.0,
            source=o.source,
            ms=o.ms,
        )
        for o in (after.expected.ops if after.expected else [])
    ]
    return TraceEvidence(
        profile=path,
        from_trace=[o.name for o in ops if o.source == "trace"],
        kept=[o.name for o in ops if o.source != "trace"],
        ops=ops,
        step_ms_before=before.expected.decode_ms_per_token if before.expected else None,
        step_ms=after.expected.decode_ms_per_token if after.expected else None,
        notes=[a for a in after.assumptions if a.startswith("trace ")],
    )
