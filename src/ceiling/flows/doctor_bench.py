"""The doctor's bench stages (single stream, then the concurrency sweep), the trace windows
recorded after each, and whether the server is still alive after them.

Why apart from the flow: a bench stage is the one place where the server may die under the
doctor; what it measured is kept, the death is recorded (``server_died``, its cause), and later
bench stages are skipped. ``ceiling.flows.doctor.STAGES`` declares when each of these runs.
"""

from __future__ import annotations

import contextlib
import subprocess

from ceiling import interrupts
from ceiling.bench.failures import failure_statement
from ceiling.bench.runner import run_bench
from ceiling.diagnose.schema import BenchMode, Telemetry
from ceiling.flows import doctor_trace
from ceiling.flows.doctor_checks import bench_config
from ceiling.flows.doctor_context import DoctorContext
from ceiling.flows.target import server_alive
from ceiling.probe.telemetry import TelemetrySampler
from ceiling.run.launcher import Server

# heuristic: how long a launched server's process may take to exit after its requests failed
# (the engine died; its guard notices and exits within a poll interval)
DEATH_GRACE_S = 3.0


def bench_stage(ctx: DoctorContext, mode: BenchMode) -> None:
    """One bench stage; afterwards, check the server is still there (and say so if not)."""
    cfg, res, rec = ctx.cfg, ctx.res, ctx.rec
    if res.server_died:
        rec.skip(f"bench {mode}", "server died earlier")
        return
    if mode == "concurrency" and not cfg.concurrency:
        rec.skip("bench concurrency", "no concurrency levels asked")
        return
    path = ctx.out / f"bench-{mode}.json"
    with rec.stage(f"bench {mode}") as st:
        sampler = TelemetrySampler(interval_s=0.05) if cfg.telemetry and mode == "single" else None
        if sampler is not None:
            sampler.start()  # never raises: no NVML -> the series says unavailable
        try:
            b = run_bench(bench_config(cfg, ctx.url, ctx.served, mode, path), progress=cfg.progress)
            res.bench[mode] = b
            res.files[f"bench_{mode}"] = str(path)
            st.message = f"{b.completed} requests, partial: {b.partial}" + (
                f" ({b.partial_reason})" if b.partial else ""
            )
            why = failure_statement(b, cfg.max_failed_pct)
            if b.partial or why:
                st.status, st.message = "failed", why or st.message
        finally:
            if sampler is not None:
                res.telemetry = _telemetry(sampler)
            failed = mode in res.bench and res.bench[mode].failed > 0
            if not _alive_after(ctx.server, ctx.url, failed):
                res.server_died = True
                res.server_death = _death_text(ctx.server, ctx.url, mode)
        if interrupts.requested() is not None:  # bench kept its partial; the doctor stops
            raise KeyboardInterrupt


def trace_stage(ctx: DoctorContext, mode: BenchMode) -> None:
    if ctx.setup is None:  # the table's TRACED step never runs so: kept for the type
        return
    ranks = doctor_trace.ranks_of(ctx.variant)
    res, cfg = ctx.res, ctx.cfg
    doctor_trace.trace_windows(ctx.rec, res, cfg, ctx.setup, ctx.url, ctx.served, mode, ranks)


def _alive_after(server: Server | None, url: str, failed: bool) -> bool:
    """Whether the server still runs after a bench stage. A dead engine fails requests at once;
    the process doctor holds (a guard may sit before it) gets ``DEATH_GRACE_S`` to exit."""
    if server is None:
        return server_alive(url)
    if failed:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.proc.wait(timeout=DEATH_GRACE_S)
    return bool(server.alive())


def _telemetry(sampler: TelemetrySampler) -> Telemetry:
    series = sampler.stop()
    return Telemetry.model_validate(
        series.model_dump() | {"summary": series.summary(label="the single-stream bench")}
    )


def _death_text(server: Server | None, url: str, stage: str) -> str:
    if server is not None:
        d = server.death()
        ev = ("; log: " + " | ".join(d.evidence[-2:])) if d.evidence else ""
        return f"during bench {stage}: exit code {d.exit_code}: {d.cause}{ev}"
    return f"during bench {stage}: {url} stopped answering"
