"""Run a sweep: preflight every variant, then one trial per variant, recorded as it happens.

A trial is: launch the variant's server, bench it ``repeats`` times (one repeat at a time, each
committed to the ledger the moment it finishes), stop early once the variant cannot
significantly beat the baseline, tear the server down. The baseline runs first and in full, so
the others have something to be compared with.

Trials are generators of events (``launched``, ``repeat``, ``stopped_early``, ``failed``,
``done``) so that the same trial code runs in this process (:class:`LocalExecutor`) or on a Ray
cluster node (:class:`RayExecutor`) while the ledger stays on the driver: a lost worker loses at
most the repeat it was running.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from ceiling.errors import CeilingError
from ceiling.sweep.early_stop import decide, gain_interval
from ceiling.sweep.ledger import FINISHED, Ledger
from ceiling.sweep.plan import EarlyStop, Plan, fingerprint, load_plan, materialize

SCHEMA_VERSION = 1

Event = dict[str, Any]


class TrialSpec(BaseModel):
    """Everything a trial needs, picklable (it travels to Ray workers)."""

    name: str
    variant_path: str
    fingerprint: str
    bench: dict[str, Any]
    repeats_total: int
    repeats_done: int = 0
    samples_done: list[float] = Field(default_factory=list)
    baseline_samples: list[float] | None = None
    early_stop: EarlyStop = Field(default_factory=EarlyStop)
    launch_timeout_s: float = 1800.0
    out_dir: str
    log_dir: str


TrialFn = Callable[[TrialSpec], Iterator[Event]]


def execute_trial(spec: TrialSpec) -> Iterator[Event]:
    """The real trial: launch the engine, bench repeat by repeat, tear down.

    Failures to launch (preflight passed but the engine died) become a ``failed`` event with the
    engine's classified cause and its log path; the sweep goes on with the next variant.
    """
    from ceiling.bench.config import BenchConfig
    from ceiling.bench.runner import run_bench
    from ceiling.engines.variant import load_variant
    from ceiling.run.launcher import launch

    variant = load_variant(spec.variant_path).with_overrides(log_dir=spec.log_dir)
    samples = list(spec.samples_done)
    try:
        with launch(variant, timeout_s=spec.launch_timeout_s, progress=False) as server:
            yield {"type": "launched", "log_path": str(server.log_path), "url": server.url}
            for idx in range(spec.repeats_done, spec.repeats_total):
                out = Path(spec.out_dir) / "results" / f"{spec.name}-{spec.fingerprint}-r{idx}.json"
                cfg = BenchConfig(
                    **{
                        **spec.bench,
                        "url": server.url,
                        "model": server.model,
                        "repeat": 1,
                        "out": out,
                    }
                )
                res = run_bench(cfg, progress=False)
                if res.partial:
                    # A partial repeat is not a measurement. A live server means the user
                    # interrupted (Ctrl-C): leave the trial resumable. A dead one is a failure.
                    if server.alive():
                        raise KeyboardInterrupt(res.partial_reason or "interrupted")
                    yield {
                        "type": "failed",
                        "log_path": str(server.log_path),
                        "error": f"server died during repeat {idx}: {res.partial_reason}",
                    }
                    return
                tok = res.decode_tok_s_per_stream
                yield {
                    "type": "repeat",
                    "idx": idx,
                    "tok_s": tok,
                    "result": res.model_dump(mode="json"),
                    "result_path": str(out),
                }
                if tok is not None:
                    samples.append(tok)
                if spec.baseline_samples is not None:
                    d = decide(spec.baseline_samples, samples, spec.early_stop)
                    if d.stop:
                        yield {"type": "stopped_early", "reason": d.reason}
                        return
    except CeilingError as exc:
        log = getattr(exc, "log_path", None)
        yield {"type": "failed", "error": exc.message, "log_path": str(log) if log else None}
        return
    yield {"type": "done"}


class Executor(Protocol):
    """Runs one trial somewhere and streams its events back to the driver."""

    def run(self, spec: TrialSpec, trial_fn: TrialFn) -> Iterator[Event]: ...

    def close(self) -> None: ...


class LocalExecutor:
    """Trials in this process, one after another."""

    def run(self, spec: TrialSpec, trial_fn: TrialFn) -> Iterator[Event]:
        yield from trial_fn(spec)

    def close(self) -> None:
        pass


class RayExecutor:
    """Trials as Ray tasks (streaming generators) on nodes with the GPUs they need.

    The ledger stays on the driver: each event comes back as soon as the worker yields it and
    is committed before the next one is read. ``address=None`` starts a local Ray instance
    (this is how it is tested on a CPU-only machine).
    """

    def __init__(
        self, address: str | None = None, gpus_per_trial: float = 0, cpus_per_trial: float = 1
    ) -> None:
        try:
            import ray
        except ImportError as exc:
            raise CeilingError(
                "the Ray executor needs the `ray` package",
                fix="pip install 'ceiling[ray]' (or use executor: local)",
            ) from exc
        self.ray = ray
        if not ray.is_initialized():
            kwargs: dict[str, Any] = (
                {"address": address}
                if address
                else {"num_cpus": max(int(cpus_per_trial), 1), "include_dashboard": False}
            )
            ray.init(ignore_reinit_error=True, log_to_driver=False, **kwargs)
        self.gpus, self.cpus = gpus_per_trial, cpus_per_trial

    def run(self, spec: TrialSpec, trial_fn: TrialFn) -> Iterator[Event]:
        ray = self.ray

        def remote_trial(payload: dict[str, Any]) -> Iterator[Event]:
            yield from trial_fn(TrialSpec.model_validate(payload))

        task = ray.remote(remote_trial).options(
            num_gpus=self.gpus, num_cpus=self.cpus, num_returns="streaming", max_retries=0
        )
        gen = task.remote(spec.model_dump(mode="json"))
        try:
            for ref in gen:
                yield ray.get(ref)
        except ray.exceptions.RayError as exc:
            yield {"type": "failed", "error": f"ray worker failed: {exc}".splitlines()[0]}

    def close(self) -> None:
        if self.ray.is_initialized():
            self.ray.shutdown()


class VariantSummary(BaseModel):
    name: str
    fingerprint: str
    status: str
    repeats: int
    tok_s: float | None = None
    low: float | None = None
    high: float | None = None
    delta_pct: float | None = None
    delta_low_pct: float | None = None
    delta_high_pct: float | None = None
    verdict: str | None = None
    log_path: str | None = None
    stop_reason: str | None = None
    error: str | None = None


class SweepResult(BaseModel):
    schema_version: int = SCHEMA_VERSION
    kind: str = "sweep"
    title: str
    plan: str | None
    ledger: str
    baseline: str
    variants: list[VariantSummary]
    comparison: list[dict[str, Any]]
    verdict: dict[str, Any]
    reproduce: list[str] = Field(default_factory=list)


def _summaries(plan: Plan, ledger: Ledger, fps: dict[str, str]) -> list[VariantSummary]:
    from ceiling.bench.stats import mean_ci

    base = ledger.samples(fps[plan.baseline_name])
    out = []
    for v in plan.variants:
        fp = fps.get(v.name)
        row = ledger.variant(fp) if fp else None
        if row is None:
            out.append(
                VariantSummary(
                    name=v.name,
                    fingerprint=fp or "",
                    status="failed",
                    repeats=0,
                    error="not run (preflight)",
                )
            )
            continue
        s = ledger.samples(fp)  # type: ignore[arg-type]
        ci = mean_ci(s)
        summ = VariantSummary(
            name=v.name,
            fingerprint=row.fingerprint,
            status=row.status,
            repeats=len(s),
            tok_s=ci.mean,
            low=ci.low,
            high=ci.high,
            log_path=row.log_path,
            stop_reason=row.stop_reason,
            error=row.error,
        )
        if v.name != plan.baseline_name and base and s:
            g, lo, hi = gain_interval(base, s)
            summ.delta_pct, summ.delta_low_pct, summ.delta_high_pct = g, lo, hi
            if lo is None or hi is None:
                summ.verdict = "no CI (fewer than 2 repeats on a side)"
            elif lo > 0:
                summ.verdict = "faster than baseline"
            elif hi < 0:
                summ.verdict = "slower than baseline"
            else:
                summ.verdict = "no significant difference"
        out.append(summ)
    return out


def _sweep_verdict(plan: Plan, rows: list[VariantSummary]) -> dict[str, Any]:
    base = next((r for r in rows if r.name == plan.baseline_name), None)
    winners = [r for r in rows if r.verdict == "faster than baseline"]
    failed = [r.name for r in rows if r.status == "failed"]
    if base is None or base.tok_s is None:
        head = "The baseline produced no measurement: nothing to compare against."
    elif winners:
        best = max(winners, key=lambda r: r.delta_pct or 0.0)
        head = (
            f"{best.name} beats the baseline {plan.baseline_name}: {best.delta_pct:+.2f} % "
            f"(95 % CI [{best.delta_low_pct:+.2f}, {best.delta_high_pct:+.2f}] %)"
        )
    else:
        head = (
            f"No variant significantly beats the baseline {plan.baseline_name} "
            f"({base.tok_s:.4g} tok/s per stream)."
        )
    notes = [f"failed: {', '.join(failed)}"] if failed else []
    stopped = [r.name for r in rows if r.status == "stopped_early"]
    if stopped:
        notes.append(f"stopped early (cannot beat the baseline): {', '.join(stopped)}")
    return {
        "headline": head,
        "measured_tok_s": base.tok_s if base else None,
        "measured_ci_low": base.low if base else None,
        "measured_ci_high": base.high if base else None,
        "notes": notes,
    }


def _preflight_all(paths: dict[str, Path]) -> dict[str, str]:
    """name -> problem text for every variant the installed engine would refuse."""
    from ceiling.engines.preflight import preflight
    from ceiling.engines.variant import load_variant

    bad: dict[str, str] = {}
    for name, path in paths.items():
        report = preflight(load_variant(path))
        if not report.ok:
            probs = [p.message for p in report.errors]
            bad[name] = "; ".join(probs) or "preflight failed"
    return bad


def run_sweep(
    plan_path: str | Path,
    out_dir: str | Path,
    *,
    resume: bool = False,
    executor: Executor | None = None,
    trial_fn: TrialFn = execute_trial,
    preflight_fn: Callable[[dict[str, Path]], dict[str, str]] | None = _preflight_all,
    on_event: Callable[[str, Event], None] | None = None,
) -> SweepResult:
    """Run (or resume) a sweep; write ``sweep.json`` and the report into ``out_dir``."""
    from ceiling.console import dumps
    from ceiling.engines.variant import load_variant

    plan = load_plan(plan_path)
    out = Path(out_dir)
    ledger_path = out / "ledger.sqlite"
    if ledger_path.exists() and not resume:
        raise CeilingError(
            f"{ledger_path} exists: a sweep already ran here",
            fix="pass --resume to continue it, or another --out directory",
        )
    paths = materialize(plan, out)
    fps = {name: fingerprint(load_variant(p), plan.bench) for name, p in paths.items()}
    bad = preflight_fn(paths) if preflight_fn else {}
    if plan.baseline_name in bad:
        raise CeilingError(
            f"baseline {plan.baseline_name} fails preflight: {bad[plan.baseline_name]}",
            fix="fix the baseline variant first",
        )
    if executor is None:
        executor = (
            RayExecutor(plan.ray.address, plan.ray.gpus_per_trial, plan.ray.cpus_per_trial)
            if plan.executor == "ray"
            else LocalExecutor()
        )
    order = [plan.baseline_name] + [v.name for v in plan.variants if v.name != plan.baseline_name]
    with Ledger(ledger_path) as ledger:
        ledger.set_meta("plan", plan.model_dump(mode="json"))
        try:
            for name in order:
                fp = fps[name]
                row = ledger.ensure_variant(fp, name, str(paths[name]))
                if name in bad:
                    ledger.set_status(fp, "failed", error=f"preflight: {bad[name]}")
                    continue
                if row.status in FINISHED:
                    continue
                base = (
                    None if name == plan.baseline_name else ledger.samples(fps[plan.baseline_name])
                )
                spec = TrialSpec(
                    name=name,
                    variant_path=str(paths[name]),
                    fingerprint=fp,
                    bench=plan.bench,
                    repeats_total=plan.repeats,
                    repeats_done=ledger.repeat_count(fp),
                    samples_done=ledger.samples(fp),
                    baseline_samples=base,
                    early_stop=plan.early_stop,
                    launch_timeout_s=plan.launch_timeout_s,
                    out_dir=str(out),
                    log_dir=str(out / "logs"),
                )
                if base is not None:
                    d = decide(base, spec.samples_done, plan.early_stop)
                    if d.stop:
                        ledger.set_status(
                            fp, "stopped_early", stop_reason=d.reason, finished=time.time()
                        )
                        continue
                if spec.repeats_done >= spec.repeats_total:
                    ledger.set_status(fp, "done", finished=time.time())
                    continue
                ledger.set_status(fp, "running", started=time.time())
                final = "interrupted"
                try:
                    for ev in executor.run(spec, trial_fn):
                        if on_event:
                            on_event(name, ev)
                        kind = ev.get("type")
                        if kind == "launched":
                            ledger.set_status(fp, "running", log_path=ev.get("log_path"))
                        elif kind == "repeat":
                            ledger.record_repeat(
                                fp, int(ev["idx"]), ev.get("tok_s"), ev.get("result") or {}
                            )
                        elif kind == "stopped_early":
                            ledger.set_status(
                                fp,
                                "stopped_early",
                                stop_reason=ev.get("reason"),
                                finished=time.time(),
                            )
                            final = "stopped_early"
                        elif kind == "failed":
                            ledger.set_status(
                                fp,
                                "failed",
                                error=ev.get("error"),
                                finished=time.time(),
                                **({"log_path": ev["log_path"]} if ev.get("log_path") else {}),
                            )
                            final = "failed"
                        elif kind == "done":
                            ledger.set_status(fp, "done", finished=time.time())
                            final = "done"
                finally:
                    if final == "interrupted":
                        ledger.set_status(fp, "interrupted")
        finally:
            executor.close()
        rows = _summaries(plan, ledger, fps)
    comparison = [
        {
            "label": r.name,
            "tok_s": r.tok_s,
            "low": r.low,
            "high": r.high,
            "delta_pct": r.delta_pct,
            "verdict": r.verdict or ("baseline" if r.name == plan.baseline_name else r.error),
            "status": r.status,
            "repeats": r.repeats,
        }
        for r in rows
    ]
    result = SweepResult(
        title=f"ceiling sweep — {plan.name}",
        plan=plan.source,
        ledger=str(ledger_path),
        baseline=plan.baseline_name,
        variants=rows,
        comparison=comparison,
        verdict=_sweep_verdict(plan, rows),
        reproduce=[f"ceiling sweep {plan.source} --out {out} --resume"],
    )
    (out / "sweep.json").write_text(dumps(result) + "\n", encoding="utf-8")
    from ceiling.report import render

    render(result, out)
    return result
