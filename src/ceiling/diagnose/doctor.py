"""``ceiling doctor``: predict -> preflight -> launch -> bench -> inspect -> attribute -> verdict.

Why one flow: the questions an engineer asks of a slow deployment (what could it do, what does
it do, where does the difference go, what is worth changing) need all the other modules, in
this order, with their evidence kept side by side. Every stage records what it did, how long it
took and whether it failed; a stage that fails does not throw away what earlier stages measured
(a server that dies mid-doctor leaves a report that says so and keeps every finished number).

Input: a running server (``url``, optionally its ``log`` file) or a ``variant`` file to launch.
The model comes from ``--model-path``, the variant's model, or the path the server reports in
``/v1/models`` (``root``); the hardware from ``probe`` (GPUs) or, on a machine without NVIDIA
GPUs, from a measured description of the CPU (``cpu_host``): the predict catalog describes
GPUs, so on a CPU the predicted floors are computed from this CPU's measured bandwidth and
FLOP rate, and the report says so.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field

from ceiling import interrupts
from ceiling.diagnose.expect import (
    describe_hardware,
    find_model_dir,
    model_summary,
    predict_cpu,
    predict_gpu,
)
from ceiling.diagnose.judge import Measured, attribute_result, measured_step, verdict_result
from ceiling.diagnose.runtime import inspect_run
from ceiling.diagnose.target import served_models, server_alive
from ceiling.errors import CeilingError
from ceiling.redact import use_api_key
from ceiling.sanity.run import doctor_stage

__all__ = ["DoctorConfig", "DoctorResult", "Measured", "measured_step", "run_doctor"]

SCHEMA_VERSION = 1
FLAG_HYPOTHESES = ("--num-scheduler-steps",)


class DoctorConfig(BaseModel):
    """Options of one doctor run (see docs/doctor.md)."""

    url: str | None = None
    variant: str | None = None
    log: str | None = None
    model_path: str | None = Field(None, description="model dir / config.json / catalog name")
    engine: str | None = None
    gpu: str | None = Field(None, description="catalog GPU name (default: probed)")
    tp: int | None = Field(None, ge=1)
    cuda_graphs: bool | None = Field(
        None, description="None: from the variant's flags or the engine log, else assumed on"
    )
    max_tokens: int = Field(512, ge=1)
    input_len: int = Field(64, ge=1)
    repeat: int = Field(3, ge=1)
    warmup: int = Field(1, ge=0)
    concurrency: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [1, 2, 4])
    concurrency_max_tokens: int = Field(128, ge=1)
    concurrency_requests: int | None = Field(None, ge=1)
    target_tok_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    telemetry: bool = True
    measure_cpu: bool = True
    launch_timeout_s: float = Field(1800.0, gt=0, allow_inf_nan=False)
    out_dir: str = "ceiling-out"
    flag_hypotheses: list[str] = Field(default_factory=lambda: list(FLAG_HYPOTHESES))
    sanity: bool = Field(True, description="gate on `ceiling sanity` before any measurement")
    progress: bool = True


class Stage(BaseModel):
    name: str
    status: str = "ok"  # ok | failed | skipped | interrupted
    seconds: float = 0.0
    message: str | None = None


class DoctorResult(BaseModel):
    """The doctor's result document (``doctor.json``); the report renders from it alone."""

    schema_version: int = SCHEMA_VERSION
    kind: str = "doctor"
    title: str = "ceiling doctor"
    created: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    config: dict[str, Any] = Field(default_factory=dict)
    target: dict[str, Any] = Field(default_factory=dict)
    hardware: dict[str, Any] = Field(default_factory=dict)
    model: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    prediction_note: str | None = None
    preflight: dict[str, Any] | None = None
    flag_checks: dict[str, str | None] = Field(default_factory=dict)
    sanity: dict[str, Any] | None = Field(None, description="the sanity gate's SanityReport")
    bench: dict[str, Any] = Field(default_factory=dict)
    telemetry: dict[str, Any] | None = Field(
        None, description="probe's TelemetrySeries during the single-stream bench (+ summary)"
    )
    facts: dict[str, Any] | None = None
    findings: list[dict[str, Any]] = Field(default_factory=list)
    measured: dict[str, Any] | None = Field(
        None, description="the decode step used for the attribution and its source"
    )
    attribution: dict[str, Any] | None = None
    levels: list[dict[str, Any]] = Field(default_factory=list)
    verdict: dict[str, Any] | None = None
    stages: list[Stage] = Field(default_factory=list)
    server_died: bool = False
    server_death: str | None = None
    interrupted: bool = Field(False, description="Ctrl-C/SIGTERM stopped the run: partial")
    assumptions: list[str] = Field(default_factory=list)
    reproduce: list[str] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict)


# ---------------------------------------------------------------------------- helpers


class _Recorder:
    """Records stages into the result; failures are kept, not raised (unless fatal)."""

    def __init__(self, result: DoctorResult, progress: bool) -> None:
        self.result = result
        self.progress = progress

    @contextlib.contextmanager
    def stage(self, name: str, fatal: bool = False) -> Iterator[Stage]:
        st = Stage(name=name)
        self.result.stages.append(st)
        t0 = time.monotonic()
        if self.progress:
            from ceiling.console import console

            console().print(f"[bold]doctor[/bold]: {name} ...")
        try:
            yield st
        except CeilingError as exc:
            st.status, st.message = "failed", exc.message.splitlines()[0]
            if fatal:
                raise
        except KeyboardInterrupt:
            st.status, st.message = "interrupted", interrupts.describe()
            raise
        finally:
            st.seconds = round(time.monotonic() - t0, 2)

    def skip(self, name: str, why: str) -> None:
        self.result.stages.append(Stage(name=name, status="skipped", message=why))


# ---------------------------------------------------------------------------- stages


def _flag_checks(cfg: DoctorConfig, variant: Any, engine: str | None) -> dict[str, str | None]:
    """For each flag hypothesis: why the installed engine rejects it (None: accepted)."""
    out: dict[str, str | None] = {}
    if not cfg.flag_hypotheses:
        return out
    if variant is not None:
        from ceiling.engines.preflight import preflight
        from ceiling.engines.variant import Arg

        for flag in cfg.flag_hypotheses:
            trial = variant.model_copy(deep=True)
            trial.args.append(Arg(flag=flag, values=["8"]))
            rep = preflight(trial)
            probs = [p for p in rep.errors if flag.lstrip("-") in (p.subject + p.message)]
            msg = probs[0].message if probs else None
            if msg and rep.engine_version and rep.engine_version not in msg:
                msg += f" (installed {rep.engine} {rep.engine_version})"
            out[flag] = msg
        return out
    if engine:
        from ceiling.engines import engine_names, get_engine

        if engine.lower() not in engine_names():
            return out

        removed = get_engine(engine).removed_flags()
        for flag in cfg.flag_hypotheses:
            info = removed.get(flag.lstrip("-"))
            if info:
                out[flag] = (
                    f"removed in {engine} {info.get('removed_in')}: {info.get('reason')}"
                    + (f"; instead: {info['replacement']}" if info.get("replacement") else "")
                )
    return out


def _flag_stage(
    rec: _Recorder, res: DoctorResult, cfg: DoctorConfig, variant: Any, engine: str | None
) -> None:
    with rec.stage("flag hypotheses") as st:
        res.flag_checks = _flag_checks(cfg, variant, engine)
        answers = [f"{k}: {'rejected' if v else 'accepted'}" for k, v in res.flag_checks.items()]
        st.message = ", ".join(answers) or "engine unknown: none checked"


def _bench(cfg: DoctorConfig, url: str, model: str, mode: str, out: Path) -> dict[str, Any]:
    from ceiling.bench.config import BenchConfig
    from ceiling.bench.runner import run_bench

    if mode == "single":
        bc = BenchConfig(
            url=url,
            model=model,
            mode="single",
            max_tokens=cfg.max_tokens,
            input_len=cfg.input_len,
            repeat=cfg.repeat,
            warmup=cfg.warmup,
            telemetry=False,  # the doctor samples itself and keeps the series
            save_detailed=True,
            out=out,
        )
    else:
        bc = BenchConfig(
            url=url,
            model=model,
            mode="concurrency",
            concurrency=cfg.concurrency,
            max_tokens=cfg.concurrency_max_tokens,
            input_len=cfg.input_len,
            requests=cfg.concurrency_requests,
            repeat=1,
            warmup=0,
            save_detailed=True,
            out=out,
        )
    return run_bench(bc, progress=cfg.progress).model_dump(mode="json")


# ---------------------------------------------------------------------------- the flow


def run_doctor(cfg: DoctorConfig) -> DoctorResult:
    """Run the whole flow; write ``doctor.json`` and the report into ``cfg.out_dir``.

    Every input is checked first (``doctor_checks``). An interrupt stops the flow where it is:
    the launched server is stopped, what was measured is written with ``interrupted: true``,
    and KeyboardInterrupt goes on up (the CLI exits 130).
    """
    from ceiling.diagnose.doctor_checks import check_config

    check_config(cfg)
    interrupts.reset()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = DoctorResult(config=cfg.model_dump(mode="json"))
    try:
        _flow(cfg, res, _Recorder(res, cfg.progress), out)
    except CeilingError:
        _finish(res, out)  # a refused preflight or a dead launch still leaves its report
        raise
    except KeyboardInterrupt:
        res.interrupted = True
        _finish(res, out)
        raise
    _finish(res, out)
    return res


def _flow(cfg: DoctorConfig, res: DoctorResult, rec: _Recorder, out: Path) -> None:
    """The stages, in order (see the module docstring); fills ``res`` as it goes."""
    variant = None
    with contextlib.ExitStack() as stack:
        if cfg.variant:
            from ceiling.engines.preflight import preflight
            from ceiling.engines.variant import load_variant

            variant = load_variant(cfg.variant).with_overrides(log_dir=str(out / "logs"))
            with rec.stage("preflight", fatal=True) as st:
                rep = preflight(variant)
                res.preflight = rep.summary()
                if not rep.ok:
                    msgs = "; ".join(p.message for p in rep.errors)
                    raise CeilingError(
                        f"preflight refused {variant.name}: {msgs}",
                        fix="fix the variant (see preflight.problems in doctor.json)",
                    )
                st.message = f"{rep.flags_checked} flags, {rep.env_checked} env checked"
            # before the launch: answering "would flag X help?" must not cost a model load
            _flag_stage(rec, res, cfg, variant, variant.engine)
        server = None
        if variant is not None:
            from ceiling.run.launcher import launch

            try:
                with rec.stage("launch", fatal=True) as st:
                    server = stack.enter_context(
                        launch(
                            variant,
                            timeout_s=cfg.launch_timeout_s,
                            progress=cfg.progress,
                            timeout_option="--launch-timeout",
                        )
                    )
                    st.message = f"ready in {server.ready_s or 0:.1f} s at {server.url}"
                    if server.key_note():
                        st.message += f"; {server.key_note()}"
                    stack.enter_context(use_api_key(server.api_key))
            except CeilingError as exc:
                # the engine died before it was ready: the report says why, then we stop
                res.server_died, res.server_death = True, f"at launch: {exc.message}"
                res.target = {
                    "variant": cfg.variant,
                    "launched": False,
                    "log_path": str(getattr(exc, "log_path", "") or "") or None,
                }
                raise
            url, log_path = server.url, Path(server.log_path)
        else:
            url, log_path = str(cfg.url).rstrip("/"), Path(cfg.log) if cfg.log else None
        models = served_models(url)
        served = (server.model if server is not None else None) or (
            models[0]["id"] if models else None
        )
        engine = (
            cfg.engine
            or (variant.engine if variant is not None else None)
            or (models[0].get("owned_by") if models else None)
        )
        res.target = {
            "url": url,
            "model": served,
            "variant": cfg.variant,
            "log_path": str(log_path) if log_path else None,
            "launched": server is not None,
            "engine": engine,
        }
        if variant is None:
            _flag_stage(rec, res, cfg, None, engine)
        if log_path is not None and log_path.exists():
            # start-up facts (TP, eager/CUDA graphs, dtype) describe the configuration to predict
            with rec.stage("inspect log") as st:
                _inspect(res, log_path, res.target.get("engine"), max(cfg.concurrency or [1]))
                st.message = f"{len(res.findings)} findings"
        else:
            rec.skip("inspect log", "no log file (pass --log with --url)")
        with rec.stage("sanity", fatal=True) as st:  # a broken server is not benchmarked
            st.message = doctor_stage(res, cfg, url, served, engine, variant, st)
        with rec.stage("hardware") as st:
            host = describe_hardware(cfg, res)
            st.message = res.hardware.get("description")
        model_dir = find_model_dir(cfg, variant, models)
        footprint = None
        with rec.stage("predict") as st:
            if host is not None:
                footprint = predict_cpu(cfg, res, host, model_dir, served)
                st.message = "CPU floors (predict's GPU catalog not applicable)"
            else:
                if model_dir is None:
                    raise CeilingError(
                        "cannot find the model config",
                        fix="pass --model-path (dir, config.json or catalog name)",
                    )
                res.prediction = predict_gpu(cfg, res, model_dir, variant)
                res.model = {
                    "name": served,
                    "path": model_dir,
                    "summary": model_summary(res.prediction.get("model") or {}),
                }
                res.assumptions += list(res.prediction.get("assumptions") or [])
                st.message = (
                    f"{res.prediction['decode_tok_s_per_stream']:.4g} tok/s per stream predicted"
                )
        for mode in ("single", "concurrency"):
            _bench_stage(cfg, res, rec, mode, url, served, server, out)
        if log_path is not None and log_path.exists():
            with rec.stage("inspect log (after the bench)") as st:
                _inspect(res, log_path, res.target.get("engine"), max(cfg.concurrency or [1]))
                st.message = f"{len(res.findings)} findings"
        with rec.stage("attribute") as st:
            attribute_result(cfg, res, footprint, host, variant)
            st.message = (res.attribution or {}).get("bound_by") or "no decode measurement"
        with rec.stage("verdict"):
            verdict_result(cfg, res, footprint, host)
        res.title = (
            f"ceiling doctor — {served or 'server'} on "
            f"{'CPU ' + res.hardware.get('name', '') if host else res.hardware.get('name')}"
        )
        _reproduce(cfg, res, url, served)


def _bench_stage(
    cfg: DoctorConfig,
    res: DoctorResult,
    rec: _Recorder,
    mode: str,
    url: str,
    served: str | None,
    server: Any,
    out: Path,
) -> None:
    """One bench stage; afterwards, check the server is still there (and say so if not)."""
    if res.server_died:
        rec.skip(f"bench {mode}", "server died earlier")
        return
    if mode == "concurrency" and not cfg.concurrency:
        rec.skip("bench concurrency", "no concurrency levels asked")
        return
    fname = f"bench-{mode}.json"
    with rec.stage(f"bench {mode}") as st:
        sampler = _start_telemetry() if (cfg.telemetry and mode == "single") else None
        try:
            res.bench[mode] = b = _bench(cfg, url, served or "", mode, out / fname)
            res.files[f"bench_{mode}"] = str(out / fname)
            st.message = f"{b.get('completed')} requests, partial: {b.get('partial')}" + (
                f" ({b.get('partial_reason')})" if b.get("partial") else ""
            )
            if b.get("partial"):
                st.status = "failed"
        finally:
            if sampler is not None:
                res.telemetry = _stop_telemetry(sampler)
            alive = server.alive() if server is not None else server_alive(url)
            if not alive:
                res.server_died = True
                res.server_death = _death_text(server, url, mode)
        if interrupts.requested() is not None:  # bench kept its partial; the doctor stops
            raise KeyboardInterrupt


def _start_telemetry() -> Any:
    """NVML sampling during the single-stream bench (never raises: no NVML -> unavailable)."""
    from ceiling.probe.telemetry import TelemetrySampler

    sampler = TelemetrySampler(interval_s=0.05)
    sampler.start()
    return sampler


def _stop_telemetry(sampler: Any) -> dict[str, Any]:
    series = sampler.stop()
    data = series.model_dump(mode="json")
    data["summary"] = series.summary(label="the single-stream bench")
    return data


def _death_text(server: Any, url: str, stage: str) -> str:
    if server is not None:
        d = server.death()
        ev = ("; log: " + " | ".join(d.evidence[-2:])) if d.evidence else ""
        return f"during bench {stage}: exit code {d.exit_code}: {d.cause}{ev}"
    return f"during bench {stage}: {url} stopped answering"


def _inspect(res: DoctorResult, log_path: Path, engine: str | None, concurrency: int) -> None:
    res.findings, res.facts = inspect_run(res, log_path, engine, concurrency)


def _reproduce(cfg: DoctorConfig, res: DoctorResult, url: str, model: str | None) -> None:
    target = (
        f"--variant {cfg.variant}"
        if cfg.variant
        else f"--url {url}"
        + (f" --log {cfg.log}" if cfg.log else "")
        + (f" --model-path {cfg.model_path}" if cfg.model_path else "")
    )
    conc = ",".join(str(c) for c in cfg.concurrency)
    res.reproduce = [
        f"ceiling doctor {target} --max-tokens {cfg.max_tokens} --repeat {cfg.repeat} "
        f"--concurrency {conc or 'none'} --out {cfg.out_dir}",
        f"ceiling bench --url {url} --model {model} --mode single --max-tokens {cfg.max_tokens} "
        f"--input-len {cfg.input_len} --repeat {cfg.repeat}",
    ]
    if conc:
        res.reproduce.append(
            f"ceiling bench --url {url} --model {model} --mode concurrency --concurrency {conc} "
            f"--max-tokens {cfg.concurrency_max_tokens} --input-len {cfg.input_len}"
        )
    if cfg.variant:
        res.reproduce.insert(0, f"ceiling preflight {cfg.variant}")


def _finish(res: DoctorResult, out: Path) -> None:
    from ceiling.console import dumps
    from ceiling.report import render

    path = out / "doctor.json"
    res.files["doctor"] = str(path)
    res.files.update(
        {
            f"report_{k}": v
            for k, v in {"md": str(out / "report.md"), "html": str(out / "report.html")}.items()
        }
    )
    from ceiling.redact import redact

    text = redact(dumps(res))  # an API key never reaches the files a user keeps or shares
    path.write_text(text + "\n", encoding="utf-8")
    render(json.loads(text), out)
