"""``ceiling doctor``: preflight -> hardware -> launch -> inspect -> sanity -> predict -> bench
-> attribute -> verdict. Entry point: :func:`run` (``run(config, report) -> DoctorResult``).

Why one flow: the questions an engineer asks of a slow deployment (what could it do, what does
it do, where does the difference go, what is worth changing) need all the other modules, in
this order, with their evidence kept side by side. Every stage records what it did, how long it
took and whether it failed; a stage that fails does not throw away what earlier stages measured
(a server that dies mid-doctor leaves a result that says so and keeps every finished number).

Input: a running server (``url``, optionally its ``log`` file) or a ``variant`` file to launch.
The model comes from ``--model``, the variant's model, or the path the server reports in
``/v1/models`` (``root``); the hardware from ``probe`` (GPUs) or a measured CPU (``cpu_host``,
before a launch: predict's CPU backend then gives the floors of its bandwidth and FLOP rate).

The stages' decisions live in ``ceiling.diagnose`` without I/O: ``expect`` (the prediction),
``judge`` (attribution and verdict), ``runtime`` (the log's and the run's findings); the I/O
lives here and in the libraries this flow calls (``hardware``: probing; ``target``: the
server over HTTP; bench, launch, sanity, telemetry). One function per stage (``_*_stage``),
called in order by :func:`_flow`: a new stage is one function and one line there. This module
writes ``doctor.json``; the report is rendered by whoever asks for it (``report``: the CLI
passes ``ceiling.report.render``): a diagnosis never imports its report.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ceiling import interrupts
from ceiling.bench.failures import failure_statement
from ceiling.bench.runner import run_bench
from ceiling.bench.served import ServedModel
from ceiling.console import console, dumps
from ceiling.diagnose.expect import expect
from ceiling.diagnose.judge import attribution, level_attributions, verdict
from ceiling.diagnose.measured import ServerView, counted_acceptance, measured_step
from ceiling.diagnose.runtime import inspect_run
from ceiling.diagnose.schema import (
    BenchMode,
    DoctorConfig,
    DoctorResult,
    Measured,
    Preflight,
    Stage,
    Target,
    Telemetry,
)
from ceiling.diagnose.setup import Seen, report_title, resolve
from ceiling.diagnose.verdict import broken_output_verdict
from ceiling.engines.variant import Variant, load_variant
from ceiling.errors import CeilingError
from ceiling.flows import doctor_llamacpp, doctor_trace, preflight
from ceiling.flows.doctor_checks import (
    bench_config,
    bench_failure,
    check_config,
    random_weights,
    reproduce,
)
from ceiling.flows.flag_hypotheses import flag_checks
from ceiling.flows.hardware import describe_hardware, find_model_dir, target_gguf
from ceiling.flows.setup_seen import seen_before_launch, seen_of_server, stated_setup
from ceiling.flows.target import engine_of, served_models, server_alive
from ceiling.outputs import write_atomic
from ceiling.probe.telemetry import TelemetrySampler
from ceiling.redact import redact, use_api_key
from ceiling.run.launcher import launch
from ceiling.sanity.gate import SanityBroken, doctor_gate

__all__ = ["DoctorConfig", "DoctorResult", "Measured", "measured_step", "run"]

#: What renders the report of a result into a directory (``ceiling.report.render``).
Reporter = Callable[[DoctorResult, Path], object]
# heuristic: how long a launched server's process may take to exit after its requests failed
# (the engine died; its guard notices and exits within a poll interval)
DEATH_GRACE_S = 3.0


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
            console().print(f"[bold]doctor[/bold]: {name} ...")  # our stage names
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


def _flag_stage(
    rec: _Recorder,
    res: DoctorResult,
    cfg: DoctorConfig,
    variant: Variant | None,
    engine: str | None,
) -> None:
    with rec.stage("flag hypotheses") as st:
        res.flag_checks = flag_checks(cfg.flag_hypotheses, variant, engine)
        answers = [f"{k}: {'rejected' if v else 'accepted'}" for k, v in res.flag_checks.items()]
        st.message = ", ".join(answers) or "engine unknown: none checked"


def run(cfg: DoctorConfig, report: Reporter | None = None) -> DoctorResult:
    """Run the whole flow; write ``doctor.json`` (and, given ``report``, the report) into
    ``cfg.out_dir``.

    Every input is checked first (``doctor_checks``). An interrupt stops the flow where it is:
    the launched server is stopped, what was measured is written with ``interrupted: true``,
    and KeyboardInterrupt goes on up (the CLI exits 130). A refused preflight, a launch that
    died or a broken output (sanity gate) also leave ``doctor.json`` and the report.
    """
    check_config(cfg)
    interrupts.reset()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = DoctorResult(config=cfg.model_copy())
    try:
        _flow(cfg, res, _Recorder(res, cfg.progress), out)
    except CeilingError:
        _finish(res, out, report)
        raise
    except KeyboardInterrupt:
        res.interrupted = True
        _finish(res, out, report)
        raise
    _finish(res, out, report)
    return res


def _preflight_stage(rec: _Recorder, res: DoctorResult, variant: Variant) -> None:
    with rec.stage("preflight", fatal=True) as st:
        rep = preflight.run(variant)
        res.preflight = Preflight.model_validate(rep.model_dump())
        if not rep.ok:
            msgs = "; ".join(p.message for p in rep.errors)
            raise CeilingError(
                f"preflight refused {variant.name}: {msgs}",
                fix="fix the variant (see preflight.problems in doctor.json)",
            )
        st.message = f"{rep.flags_checked} flags, {rep.env_checked} env checked"


def _sanity_stage(
    rec: _Recorder,
    res: DoctorResult,
    cfg: DoctorConfig,
    url: str,
    served: str | None,
    variant: Variant | None,
) -> None:
    """The sanity gate: a server whose output is broken is reported as broken and the doctor
    stops (SanityBroken) before any bench, unless ``accept_broken_output`` gives a reason: then
    the verdict and the reason are both recorded (``res.sanity_override``) and it goes on."""
    if not cfg.sanity:
        rec.skip("sanity", "turned off")
        return
    with rec.stage("sanity", fatal=True) as st:
        dtype = res.facts.dtype if res.facts is not None else None
        rep = doctor_gate(url, served, res.target.engine, cfg.model_path, variant, dtype)
        res.sanity = rep
        # a server told to load random weights answers noise by design: measured, and said so
        reason = cfg.accept_broken_output or random_weights(res, variant)
        if rep.verdict == "broken" and reason:
            res.sanity_override = reason
            st.message = f"{rep.headline}; measured anyway: {reason}"
            return
        if rep.verdict == "broken":
            res.verdict = broken_output_verdict(rep)
            raise SanityBroken(rep)
        st.message = rep.headline


def _flow(cfg: DoctorConfig, res: DoctorResult, rec: _Recorder, out: Path) -> None:
    """The stages, in order (see the module docstring); fills ``res`` as it goes."""
    variant = setup = None
    with contextlib.ExitStack() as stack:
        if cfg.variant:
            variant = load_variant(cfg.variant).with_overrides(log_dir=str(out / "logs"))
            cfg = _setup_stage(rec, res, cfg, seen_before_launch(variant))
            if cfg.trace:  # the engine's profiler settings, checked by preflight like any flag
                variant, setup = doctor_trace.traced_variant(variant, cfg, out)
            _preflight_stage(rec, res, variant)
            # before the launch: answering "would flag X help?" must not cost a model load
            _flag_stage(rec, res, cfg, variant, variant.engine)
            _hardware_stage(rec, res, cfg)  # a CPU's rates, before the engine's threads share it
        server = _launch_stage(rec, res, cfg, variant, stack) if variant is not None else None
        if server is not None:
            url, log_path = server.url, Path(server.log_path) if server.log_path else None
        else:
            url, log_path = str(cfg.url).rstrip("/"), Path(cfg.log) if cfg.log else None
        models = served_models(url)
        served = _target(res, cfg, variant, server, url, log_path, models)
        if variant is None:
            _flag_stage(rec, res, cfg, None, res.target.engine)
        readable_log = log_path if log_path is not None and log_path.exists() else None
        if readable_log is not None:
            # start-up facts (TP, eager/CUDA graphs, dtype) describe the configuration to predict
            _inspect_stage(rec, res, cfg, readable_log, "inspect log", variant)
        else:
            rec.skip("inspect log", "no log file (pass --log with --url)")
        if cfg.trace and setup is None:  # after the log: it may say where the server writes
            log_args = res.facts.non_default_args if res.facts is not None else {}
            setup = doctor_trace.unlaunched_setup(res.target.engine, cfg, out, url, log_args)
        if variant is None:  # what the server shows, before the sanity gate and the bench
            cfg = _setup_stage(
                rec, res, cfg, seen_of_server(url, models, served, res.target.engine, res.facts)
            )
        _sanity_stage(rec, res, cfg, url, served, variant)
        if variant is None:
            _hardware_stage(rec, res, cfg)
        _predict_stage(rec, res, cfg, variant, models, served)
        modes: tuple[BenchMode, ...] = ("single", "concurrency")
        for mode in modes:
            _bench_stage(cfg, res, rec, mode, url, served, server, out)
            if setup is not None:  # its own span: no window overlaps a measured repeat
                ranks = doctor_trace.ranks_of(variant)
                doctor_trace.trace_windows(rec, res, cfg, setup, url, served, mode, ranks)
        if readable_log is not None:
            _inspect_stage(rec, res, cfg, readable_log, "inspect log (after the bench)", variant)
        if _counted_acceptance(res):  # the engine's counters over the run: predict with them
            _predict_stage(rec, res, cfg, variant, models, served, "predict (measured acceptance)")
        doctor_trace.feed_predict(rec, res, out)  # the window's kernel times as predict evidence
        _attribute_stage(rec, res, cfg)
        _verdict_stage(rec, res, cfg)
        res.title = report_title(served, res.hardware, cfg.tp)
        res.reproduce = reproduce(res.config, url, served)


def _setup_stage(rec: _Recorder, res: DoctorResult, cfg: DoctorConfig, seen: Seen) -> DoctorConfig:
    """The stated setup against the seen one (``diagnose.setup``): a contradiction stops the
    doctor here; what is as given, not seen, becomes an assumption. The configuration the
    later stages read: the TP the server was seen to run, ``--gpu`` by its catalog name."""
    with rec.stage("setup", fatal=True) as st:
        setup = resolve(stated_setup(cfg), seen)
        res.assumptions += setup.notes
        st.message = "; ".join(setup.notes) or "as stated and seen"
    return cfg.model_copy(update={"tp": setup.tp, "gpu": setup.gpu})


def _launch_stage(
    rec: _Recorder,
    res: DoctorResult,
    cfg: DoctorConfig,
    variant: Variant,
    stack: contextlib.ExitStack,
) -> Any:
    """Launch the variant (stopped when ``stack`` closes); an engine that dies before it is
    ready is recorded (``server_died``, its log) and the doctor stops."""
    try:
        with rec.stage("launch", fatal=True) as st:
            server = stack.enter_context(
                launch(
                    variant,
                    timeout_s=cfg.launch_timeout_s,
                    progress=cfg.progress,
                    timeout_option="--ready-timeout",
                )
            )
            st.message = f"ready in {server.ready_s or 0:.1f} s at {server.url}"
            if server.key_note():
                st.message += f"; {server.key_note()}"
            stack.enter_context(use_api_key(server.api_key))
            return server
    except CeilingError as exc:
        # the engine died before it was ready: the report says why, then we stop
        res.server_died, res.server_death = True, f"at launch: {exc.message}"
        log = str(getattr(exc, "log_path", "") or "") or None
        res.target = Target(variant=cfg.variant, launched=False, log_path=log)
        raise


def _target(
    res: DoctorResult,
    cfg: DoctorConfig,
    variant: Variant | None,
    server: Any,
    url: str,
    log_path: Path | None,
    models: list[ServedModel],
) -> str | None:
    """Record what is examined (``res.target``); the served model name."""
    served = (
        cfg.served_model
        or (server.model if server is not None else None)
        or (models[0].id if models else None)
    )
    engine = (
        cfg.engine
        or (variant.engine if variant is not None else None)
        or (engine_of(models[0]) if models else None)
    )
    res.target = Target(
        url=url,
        model=served,
        variant=cfg.variant,
        log_path=str(log_path) if log_path else None,
        launched=server is not None,
        engine=engine,
    )
    return served


def _hardware_stage(rec: _Recorder, res: DoctorResult, cfg: DoctorConfig) -> None:
    with rec.stage("hardware") as st:
        res.hardware, notes = describe_hardware(cfg)
        res.assumptions += notes
        st.message = res.hardware.description


def _predict_stage(
    rec: _Recorder,
    res: DoctorResult,
    cfg: DoctorConfig,
    variant: Variant | None,
    models: list[ServedModel],
    served: str | None,
    name: str = "predict",
) -> None:
    with rec.stage(name) as st:
        if res.hardware is None:  # the hardware stage failed (its stage says why)
            raise CeilingError("no hardware to predict for", fix="see the hardware stage")
        # a llama.cpp target: its GGUF (never predicted as if it were vLLM); else None
        gguf = target_gguf(cfg, variant, res.target.engine, res.facts, res.target.url)
        model_dir = find_model_dir(cfg, variant, models)
        exp = expect(cfg, res.hardware, model_dir, served, res.facts, variant, gguf=gguf)
        res.prediction, res.model, res.prediction_note = exp.prediction, exp.model, exp.note
        res.assumptions += exp.assumptions
        tok_s = exp.prediction.decode_tok_s_per_stream
        st.message = (
            f"{exp.predictor}: {tok_s:.4g} tok/s per stream expected"
            if exp.prediction.expected_tok_s is not None
            else f"{exp.predictor}: bound {tok_s:.4g} tok/s per stream"
            + ("" if gguf else " (predict's GPU model does not apply)")
        )


def _counted_acceptance(res: DoctorResult) -> bool:
    """Put the acceptance length the engine counted over the single-stream run into the facts
    (it covers exactly the measured requests; the log's metrics line is the last interval
    only). True when it did: the prediction is then made again with it."""
    facts = res.facts
    if facts is None or facts.spec_method is None:
        return False
    got = counted_acceptance(ServerView.of(res.bench.get("single")))
    if got is None:
        return False
    facts.spec_mean_acceptance, line = round(got[0], 3), got[1]
    facts.add_evidence("spec_decode", line)
    return True


def _attribute_stage(rec: _Recorder, res: DoctorResult, cfg: DoctorConfig) -> None:
    with rec.stage("attribute") as st:
        res.levels = level_attributions(cfg, res)
        res.measured = measured_step(res.bench.get("single"))
        res.attribution = attribution(res, res.measured)
        st.message = res.attribution.bound_by if res.attribution else "no decode measurement"


def _verdict_stage(rec: _Recorder, res: DoctorResult, cfg: DoctorConfig) -> None:
    failed = None if res.server_died else bench_failure(res)
    if failed:  # no verdict from a failed run: the flow says what failed instead
        rec.skip("verdict", f"no verdict: {failed[1]}")
        return
    with rec.stage("verdict"):
        res.verdict = verdict(cfg, res)
    if res.verdict is not None and res.verdict.bottleneck.case != "broken-output":
        with rec.stage("llama.cpp bandwidth") as st:
            st.message = doctor_llamacpp.attach(res, cfg)


def _inspect_stage(
    rec: _Recorder,
    res: DoctorResult,
    cfg: DoctorConfig,
    log_path: Path,
    name: str,
    variant: Variant | None = None,
) -> None:
    with rec.stage(name) as st:
        res.facts, res.findings = inspect_run(
            log_path,
            res.target.engine,
            res.hardware,
            res.bench,
            concurrency=max(cfg.concurrency or [1]),
            request_tokens=cfg.input_len + cfg.max_tokens,
            env=variant.env if variant is not None else None,
        )
        st.message = f"{len(res.findings)} findings"


def _bench_stage(
    cfg: DoctorConfig,
    res: DoctorResult,
    rec: _Recorder,
    mode: BenchMode,
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
    path = out / f"bench-{mode}.json"
    with rec.stage(f"bench {mode}") as st:
        sampler = TelemetrySampler(interval_s=0.05) if cfg.telemetry and mode == "single" else None
        if sampler is not None:
            sampler.start()  # never raises: no NVML -> the series says unavailable
        try:
            b = run_bench(bench_config(cfg, url, served, mode, path), progress=cfg.progress)
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
            if not _alive_after(server, url, failed):
                res.server_died = True
                res.server_death = _death_text(server, url, mode)
        if interrupts.requested() is not None:  # bench kept its partial; the doctor stops
            raise KeyboardInterrupt


def _alive_after(server: Any, url: str, failed: bool) -> bool:
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


def _death_text(server: Any, url: str, stage: str) -> str:
    if server is not None:
        d = server.death()
        ev = ("; log: " + " | ".join(d.evidence[-2:])) if d.evidence else ""
        return f"during bench {stage}: exit code {d.exit_code}: {d.cause}{ev}"
    return f"during bench {stage}: {url} stopped answering"


def _finish(res: DoctorResult, out: Path, report: Reporter | None) -> None:
    path = out / "doctor.json"
    res.files["doctor"] = str(path)
    if report is not None:
        res.files["report_md"] = str(out / "report.md")
        res.files["report_html"] = str(out / "report.html")
    text = redact(dumps(res))  # an API key never reaches the files a user keeps or shares
    write_atomic(path, text + "\n", what="doctor result")
    if report is not None:
        # rendered from the file's own content (redacted), read back as the nouns it holds
        report(DoctorResult.model_validate_json(text), out)
