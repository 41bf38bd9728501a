"""Run a sweep: preflight every variant, then one trial per variant, recorded as it happens.

A trial is: launch the variant's server, bench it ``repeats`` times (one repeat at a time, each
committed to the ledger the moment it finishes), stop early once the variant cannot
significantly beat the baseline, tear the server down. The baseline runs first and in full, so
the others have something to be compared with.

Trials (``sweep_trial.py``) stream events back; this module keeps the ledger on the driver, commits
every event as it arrives, and writes ``sweep.json`` and the report at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from ceiling.bench.config import BenchConfig
from ceiling.bench.stats import mean_ci
from ceiling.console import dumps
from ceiling.engines.variant import load_variant
from ceiling.errors import CeilingError
from ceiling.flows import preflight
from ceiling.flows.sweep_trial import (
    Event,
    Executor,
    LocalExecutor,
    RayExecutor,
    TrialFn,
    TrialSpec,
    execute_trial,
)
from ceiling.inputs import check_out_dir
from ceiling.outputs import write_atomic
from ceiling.report import render
from ceiling.sweep.early_stop import decide, gain_interval
from ceiling.sweep.events import (
    Broken,
    Done,
    Failed,
    Launched,
    Repeat,
    SanityPassed,
    StoppedEarly,
    as_event,
)
from ceiling.sweep.ledger import FINISHED, Ledger
from ceiling.sweep.plan import Plan, fingerprint, load_plan, materialize
from ceiling.sweep.schema import ComparisonRow, SweepResult, SweepVerdict, VariantSummary

__all__ = [
    "Event",
    "Executor",
    "LocalExecutor",
    "RayExecutor",
    "SweepResult",
    "TrialSpec",
    "execute_trial",
    "run",
]


def _summaries(plan: Plan, ledger: Ledger, fps: dict[str, str]) -> list[VariantSummary]:
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
        if row.status == "broken":
            summ.verdict = "broken output (not benchmarked)"
        elif v.name != plan.baseline_name and base and s:
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


def _sweep_verdict(plan: Plan, rows: list[VariantSummary]) -> SweepVerdict:
    base = next((r for r in rows if r.name == plan.baseline_name), None)
    winners = [r for r in rows if r.verdict == "faster than baseline"]
    failed = [r.name for r in rows if r.status == "failed"]
    broken = [r.name for r in rows if r.status == "broken"]
    if base is not None and base.status == "broken":
        head = (
            f"The baseline {plan.baseline_name} gives broken output (sanity gate): nothing was "
            "benchmarked against it."
        )
    elif base is None or base.tok_s is None:
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
    if broken:
        notes.append(f"broken output, not benchmarked (sanity gate): {', '.join(broken)}")
    stopped = [r.name for r in rows if r.status == "stopped_early"]
    if stopped:
        notes.append(f"stopped early (cannot beat the baseline): {', '.join(stopped)}")
    return SweepVerdict(
        headline=head,
        measured_tok_s=base.tok_s if base else None,
        measured_ci_low=base.low if base else None,
        measured_ci_high=base.high if base else None,
        notes=notes,
    )


def _preflight_all(paths: dict[str, Path]) -> dict[str, str]:
    """name -> problem text for every variant the installed engine would refuse."""
    bad: dict[str, str] = {}
    for name, path in paths.items():
        report = preflight.run(load_variant(path))
        if not report.ok:
            probs = [p.message for p in report.errors]
            bad[name] = "; ".join(probs) or "preflight failed"
    return bad


def _check_bench(plan: Plan) -> None:
    """The plan's ``bench:`` settings are valid before the first (long) launch."""
    try:
        BenchConfig(**{**plan.bench, "url": "http://127.0.0.1:1", "repeat": 1})
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first.get("loc") or ())
        raise CeilingError(
            f"plan {plan.source}: bench.{where}: {first['msg']}", fix="see docs/sweep.md"
        ) from None
    except TypeError as err:
        raise CeilingError(f"plan {plan.source}: bench: {err}", fix="see docs/sweep.md") from None


def sweep_failure(result: SweepResult) -> str | None:
    """Why the sweep as a whole failed (None: at least one variant was measured)."""
    measured = [v for v in result.variants if v.status in ("done", "stopped_early") and v.repeats]
    if measured or not result.variants:
        return None
    states = ", ".join(f"{v.name}: {v.status}" for v in result.variants)
    return f"no variant of the sweep was measured ({states})"


def run(
    plan_path: str | Path,
    out_dir: str | Path,
    *,
    resume: bool = False,
    executor: Executor | None = None,
    trial_fn: TrialFn = execute_trial,
    preflight_fn: Callable[[dict[str, Path]], dict[str, str]] | None = _preflight_all,
    on_event: Callable[[str, Event], None] | None = None,
    progress: bool = True,
) -> SweepResult:
    """Run (or resume) a sweep; write ``sweep.json`` and the report into ``out_dir``."""
    plan = load_plan(plan_path)
    _check_bench(plan)
    out = Path(out_dir)
    check_out_dir(out, "--out-dir")
    ledger_path = out / "ledger.sqlite"
    if ledger_path.exists() and not resume:
        raise CeilingError(
            f"{ledger_path} exists: a sweep already ran here",
            fix="pass --resume to continue it, or another --out-dir",
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
                    sanity=plan.sanity,
                    progress=progress,
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
                    for raw in executor.run(spec, trial_fn):
                        ev = as_event(raw)
                        if on_event:
                            on_event(name, ev)
                        match ev:
                            case Launched():
                                ledger.set_status(fp, "running", log_path=ev.log_path)
                            case Repeat():
                                ledger.record_repeat(fp, ev.idx, ev.tok_s, ev.result)
                            case StoppedEarly():
                                ledger.set_status(
                                    fp,
                                    "stopped_early",
                                    stop_reason=ev.reason,
                                    finished=time.time(),
                                )
                                final = "stopped_early"
                            case Broken():
                                ledger.set_status(
                                    fp, "broken", error=ev.error, finished=time.time()
                                )
                                final = "broken"
                            case Failed():
                                ledger.set_status(
                                    fp,
                                    "failed",
                                    error=ev.error,
                                    finished=time.time(),
                                    **({"log_path": ev.log_path} if ev.log_path else {}),
                                )
                                final = "failed"
                            case Done():
                                ledger.set_status(fp, "done", finished=time.time())
                                final = "done"
                            case SanityPassed():
                                pass  # the gate passed: the repeats follow
                finally:
                    if final == "interrupted":
                        ledger.set_status(fp, "interrupted")
        finally:
            executor.close()
        rows = _summaries(plan, ledger, fps)
    comparison = [
        ComparisonRow(
            label=r.name,
            tok_s=r.tok_s,
            low=r.low,
            high=r.high,
            delta_pct=r.delta_pct,
            verdict=r.verdict or ("baseline" if r.name == plan.baseline_name else r.error),
            status=r.status,
            repeats=r.repeats,
        )
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
        reproduce=[f"ceiling sweep {plan.source} --out-dir {out} --resume"],
    )
    write_atomic(out / "sweep.json", dumps(result) + "\n", what="sweep result")
    render(result, out)
    return result
