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
server over HTTP; bench, launch, sanity, telemetry). One function per stage, taking the one
typed context (``doctor_context.DoctorContext``), declared in :data:`STAGES` with when it runs
and what it reads and writes, and run in order by one loop (:func:`_flow`): a new stage is one
function and one row there (``doctor_context.stage_order`` says the order in words). This module
writes ``doctor.json``; the report is rendered by whoever asks for it (``report``: the CLI
passes ``ceiling.report.render``): a diagnosis never imports its report.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from ceiling import interrupts
from ceiling.console import dumps
from ceiling.diagnose.measured import measured_step
from ceiling.diagnose.schema import (
    DoctorConfig,
    DoctorResult,
    Measured,
    Target,
)
from ceiling.diagnose.setup import report_title
from ceiling.engines.variant import Variant, load_variant
from ceiling.errors import CeilingError
from ceiling.flows import doctor_bench, doctor_trace, doctor_watch
from ceiling.flows import doctor_stages as stages
from ceiling.flows.doctor_checks import (
    check_config,
    reproduce,
)
from ceiling.flows.doctor_context import ALWAYS, URL, VARIANT, DoctorContext, Recorder, Step, When

# _counted_acceptance: its tests import it from the flow, where it was first
from ceiling.flows.doctor_stages import _counted_acceptance  # noqa: F401
from ceiling.outputs import write_atomic
from ceiling.redact import redact, use_api_key
from ceiling.run.launcher import launch
from ceiling.server.schema import ServedModel

__all__ = ["STAGES", "DoctorConfig", "DoctorResult", "Measured", "measured_step", "run"]

#: What renders the report of a result into a directory (``ceiling.report.render``).
Reporter = Callable[[DoctorResult, Path], object]


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
        _flow(cfg, res, Recorder(res, cfg.progress), out)
    except CeilingError:
        _finish(res, out, report)
        raise
    except KeyboardInterrupt:
        res.interrupted = True
        _finish(res, out, report)
        raise
    _finish(res, out, report)
    return res


def _flow(cfg: DoctorConfig, res: DoctorResult, rec: Recorder, out: Path) -> None:
    """The stages of :data:`STAGES`, in order, each where its ``when`` holds; fills ``res``."""
    with contextlib.ExitStack() as stack:
        ctx = DoctorContext(cfg=cfg, res=res, rec=rec, out=out, stack=stack)
        if cfg.variant:  # an input, read before any stage: a bad file is exit 2 at once
            variant = load_variant(cfg.variant).with_overrides(log_dir=str(out / "logs"))
            ctx.variant = variant
        check = doctor_watch.checking()
        for step in STAGES:
            if step.when(ctx):
                with doctor_watch.watched(ctx, step) if check else contextlib.nullcontext():
                    step.run(ctx)
        res.title = report_title(ctx.served, res.hardware, ctx.cfg.tp)
        res.reproduce = reproduce(res.config, ctx.url, ctx.served)


def _launch_stage(ctx: DoctorContext) -> None:
    """Launch the variant (stopped when the context's stack closes); an engine that dies
    before it is ready is recorded (``server_died``, its log) and the doctor stops. Here, not
    with the other stages: the server lives as long as :func:`_flow`'s stack."""
    cfg, res = ctx.cfg, ctx.res
    try:
        with ctx.rec.stage("launch", fatal=True) as st:
            server = ctx.stack.enter_context(
                launch(
                    stages.need_variant(ctx),
                    timeout_s=cfg.launch_timeout_s,
                    progress=cfg.progress,
                    timeout_option="--ready-timeout",
                )
            )
            st.message = f"ready in {server.ready_s or 0:.1f} s at {server.url}"
            if server.key_note():
                st.message += f"; {server.key_note()}"
            ctx.stack.enter_context(use_api_key(server.api_key))
            ctx.server = server
    except CeilingError as exc:
        # the engine died before it was ready: the report says why, then we stop
        res.server_died, res.server_death = True, f"at launch: {exc.message}"
        log = str(getattr(exc, "log_path", "") or "") or None
        res.target = Target(variant=cfg.variant, launched=False, log_path=log)
        raise


def _predict_stage(
    rec: Recorder,
    res: DoctorResult,
    cfg: DoctorConfig,
    variant: Variant | None,
    models: list[ServedModel],
    served: str | None,
    name: str = "predict",
) -> None:
    """The predict stage outside the flow (its tests call it with these alone)."""
    with contextlib.ExitStack() as stack:
        out = Path(cfg.out_dir)
        ctx = DoctorContext(cfg, res, rec, out, stack, variant, models=models, served=served)
        stages.predict_stage(ctx, name)


_Recorder = Recorder  # the name the predict stage's tests know


# the profiler's setup is made in both modes when --trace is on (before the launch, or after the
# log of a server ceiling did not launch): its presence is what the trace steps test
TRACED = When("`--trace`", lambda ctx: ctx.setup is not None)

#: The doctor's stages in the order they run (docs/doctor.md's stage order is made from it).
STAGES: tuple[Step, ...] = (
    Step(
        "setup",
        stages.setup_before_launch,
        VARIANT,
        ("variant", "cfg"),
        ("cfg", "res.assumptions"),
        "before anything else: a contradiction costs no launch",
    ),
    Step(
        "profiler settings",
        stages.traced_variant,
        When("variant with `--trace`", lambda ctx: bool(ctx.cfg.variant and ctx.cfg.trace)),
        ("variant", "cfg"),
        ("variant", "setup"),
        recorded=False,
    ),
    Step(
        "preflight",
        stages.preflight_stage,
        VARIANT,
        ("variant",),
        ("res.preflight",),
        "errors stop here, before any load; the profiler's settings are checked like any flag",
    ),
    Step(
        "flag hypotheses",
        stages.flag_stage,
        VARIANT,
        ("variant", "cfg"),
        ("res.flag_checks",),
        'before the launch: answering "would flag X help?" must not cost a model load',
    ),
    Step(
        "hardware",
        stages.hardware_stage,
        VARIANT,
        ("cfg",),
        ("res.hardware", "res.assumptions"),
        "measured before the engine's threads share the cores",
    ),
    Step("launch", _launch_stage, VARIANT, ("variant", "cfg"), ("server", "stack")),
    Step(
        "target",
        stages.find_target,
        ALWAYS,
        ("server", "cfg", "variant"),
        ("url", "log_path", "readable_log", "models", "served", "res.target"),
        recorded=False,
    ),
    Step(
        "flag hypotheses",
        stages.flag_stage,
        URL,
        ("res.target", "cfg", "variant"),
        ("res.flag_checks",),
        "the engine's removed-flags table",
    ),
    Step(
        "inspect log",
        lambda ctx: stages.inspect_stage(ctx, "inspect log"),
        ALWAYS,
        ("readable_log", "res.target", "cfg", "variant", "res.hardware", "res.bench"),
        ("res.facts", "res.findings"),
        "start-up facts: TP, eager / CUDA graphs, dtype describe the configuration to predict",
    ),
    Step(
        "profiler setup",
        stages.unlaunched_trace,
        When("`--url` with `--trace`", lambda ctx: ctx.cfg.trace and ctx.setup is None),
        ("res.facts", "url"),
        ("setup",),
        recorded=False,
    ),
    Step(
        "setup",
        stages.setup_of_server,
        URL,
        ("url", "models", "served", "res.facts", "res.target"),
        ("cfg", "res.assumptions"),
        "what the server shows, before the sanity gate and the bench",
    ),
    Step(
        "sanity",
        stages.sanity_stage,
        ALWAYS,
        ("url", "served", "res.facts", "res.target", "cfg", "variant"),
        ("res.sanity", "res.sanity_override"),
        "a broken server is not benchmarked",
    ),
    Step(
        "hardware",
        stages.hardware_stage,
        URL,
        ("cfg",),
        ("res.hardware", "res.assumptions"),
        "the server already runs: a CPU server's rates are measured beside it",
    ),
    Step(
        "predict",
        stages.predict_stage,
        ALWAYS,
        ("res.hardware", "res.facts", "res.target", "models", "served", "cfg", "variant"),
        ("res.prediction", "res.prediction_note", "res.model", "res.assumptions"),
    ),
    Step(
        "bench single",
        lambda ctx: doctor_bench.bench_stage(ctx, "single"),
        ALWAYS,
        ("url", "served", "server", "cfg"),
        ("res.bench", "res.telemetry", "res.files"),
    ),
    Step(
        "trace single",
        lambda ctx: doctor_bench.trace_stage(ctx, "single"),
        TRACED,
        ("setup", "url", "cfg", "res.bench", "served", "variant"),
        ("res.traces",),
        "its own span: no window overlaps a measured repeat",
    ),
    Step(
        "bench concurrency",
        lambda ctx: doctor_bench.bench_stage(ctx, "concurrency"),
        ALWAYS,
        ("url", "served", "server", "cfg"),
        ("res.bench", "res.files"),
    ),
    Step(
        "trace concurrency N",
        lambda ctx: doctor_bench.trace_stage(ctx, "concurrency"),
        TRACED,
        ("setup", "url", "cfg", "res.bench", "served", "variant"),
        ("res.traces",),
        "one window per level",
    ),
    Step(
        "inspect log (after the bench)",
        lambda ctx: stages.inspect_stage(ctx, "inspect log (after the bench)"),
        When("with a readable log", lambda ctx: ctx.readable_log is not None),
        ("readable_log", "res.bench", "res.target", "res.hardware", "cfg", "variant"),
        ("res.facts", "res.findings"),
        "with the findings of what the run measured",
    ),
    Step(
        "predict (measured acceptance)",
        stages.acceptance_predict,
        ALWAYS,
        ("res.bench", "res.facts"),
        ("res.prediction",),
        "only where the engine's counters counted drafts in the single run",
    ),
    Step(
        "predict (the trace's ops)",
        lambda ctx: doctor_trace.feed_predict(ctx.rec, ctx.res, ctx.out),
        TRACED,
        ("res.traces", "res.prediction", "res.assumptions", "res.bench", "res.files"),
        ("res.prediction", "res.trace_evidence", "res.assumptions", "res.files"),
        "with a recorded single-stream window",
    ),
    Step(
        "attribute",
        stages.attribute_stage,
        ALWAYS,
        ("res.bench", "res.prediction", "res.hardware", "cfg"),
        ("res.attribution", "res.levels", "res.measured"),
    ),
    Step("verdict", stages.verdict_stage, ALWAYS, ("res", "cfg"), ("res.verdict", "res.findings")),
)


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
