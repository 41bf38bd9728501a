"""The doctor's stages, each a function of the one context (``doctor_context.DoctorContext``).

Why apart from the flow: ``ceiling.flows.doctor.STAGES`` declares the order and when each of
these runs; here is only what a stage does (the I/O it calls and what it writes into the
result). A stage records itself (``ctx.rec``); a fatal one raises after recording.
"""

from __future__ import annotations

from pathlib import Path

from ceiling.diagnose.expect import expect
from ceiling.diagnose.judge import attribution, level_attributions, verdict
from ceiling.diagnose.measured import ServerView, counted_acceptance, measured_step
from ceiling.diagnose.runtime import inspect_run, server_cost_finding
from ceiling.diagnose.schema import DoctorConfig, DoctorResult, Preflight, Target
from ceiling.diagnose.setup import Seen, resolve
from ceiling.diagnose.verdict import broken_output_verdict
from ceiling.engines import get_engine
from ceiling.engines.variant import Variant
from ceiling.errors import CeilingError
from ceiling.flows import doctor_trace, preflight
from ceiling.flows.doctor_checks import bench_failure, random_weights
from ceiling.flows.doctor_context import DoctorContext
from ceiling.flows.flag_hypotheses import flag_checks
from ceiling.flows.hardware import describe_hardware, find_model_dir, target_gguf
from ceiling.flows.setup_seen import seen_before_launch, seen_of_server, stated_setup
from ceiling.flows.target import engine_of, served_models
from ceiling.gap_schema import BandwidthGap
from ceiling.sanity.gate import SanityBroken, doctor_gate


def need_variant(ctx: DoctorContext) -> Variant:
    """The launched variant, for the steps that run only with one (their ``when`` says so)."""
    if ctx.variant is None:
        raise RuntimeError("a variant-only doctor stage ran without a variant")
    return ctx.variant


def _setup(ctx: DoctorContext, seen: Seen) -> None:
    """The stated setup against the seen one (``diagnose.setup``): a contradiction stops the
    doctor here; what is as given, not seen, becomes an assumption. The configuration the
    later stages read: the TP the server was seen to run, ``--gpu`` by its catalog name."""
    with ctx.rec.stage("setup", fatal=True) as st:
        setup = resolve(stated_setup(ctx.cfg), seen)
        ctx.res.assumptions += setup.notes
        st.message = "; ".join(setup.notes) or "as stated and seen"
    ctx.cfg = ctx.cfg.model_copy(update={"tp": setup.tp, "gpu": setup.gpu})


def setup_before_launch(ctx: DoctorContext) -> None:
    _setup(ctx, seen_before_launch(need_variant(ctx)))


def setup_of_server(ctx: DoctorContext) -> None:
    res = ctx.res
    _setup(ctx, seen_of_server(ctx.url, ctx.models, ctx.served, res.target.engine, res.facts))


def traced_variant(ctx: DoctorContext) -> None:
    ctx.variant, ctx.setup = doctor_trace.traced_variant(need_variant(ctx), ctx.cfg, ctx.out)


def unlaunched_trace(ctx: DoctorContext) -> None:
    res = ctx.res
    log_args = res.facts.non_default_args if res.facts is not None else {}
    ctx.setup = doctor_trace.unlaunched_setup(
        res.target.engine, ctx.cfg, ctx.out, ctx.url, log_args
    )


def preflight_stage(ctx: DoctorContext) -> None:
    variant = need_variant(ctx)
    with ctx.rec.stage("preflight", fatal=True) as st:
        rep = preflight.run(variant)
        ctx.res.preflight = Preflight.model_validate(rep.model_dump())
        if not rep.ok:
            msgs = "; ".join(p.message for p in rep.errors)
            raise CeilingError(
                f"preflight refused {variant.name}: {msgs}",
                fix="fix the variant (see preflight.problems in doctor.json)",
            )
        st.message = f"{rep.flags_checked} flags, {rep.env_checked} env checked"


def flag_stage(ctx: DoctorContext) -> None:
    # a variant's engine is its own; a server's is the target's (known after the target step)
    engine = ctx.variant.engine if ctx.variant is not None else ctx.res.target.engine
    with ctx.rec.stage("flag hypotheses") as st:
        got = ctx.res.flag_checks = flag_checks(ctx.cfg.flag_hypotheses, ctx.variant, engine)
        answers = [f"{k}: {'rejected' if v else 'accepted'}" for k, v in got.items()]
        st.message = ", ".join(answers) or "engine unknown: none checked"


def sanity_stage(ctx: DoctorContext) -> None:
    """The sanity gate: a server whose output is broken is reported as broken and the doctor
    stops (SanityBroken) before any bench, unless ``accept_broken_output`` gives a reason: then
    the verdict and the reason are both recorded (``res.sanity_override``) and it goes on."""
    cfg, res, variant = ctx.cfg, ctx.res, ctx.variant
    if not cfg.sanity:
        ctx.rec.skip("sanity", "turned off")
        return
    with ctx.rec.stage("sanity", fatal=True) as st:
        dtype = res.facts.dtype if res.facts is not None else None
        rep = doctor_gate(ctx.url, ctx.served, res.target.engine, cfg.model_path, variant, dtype)
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


def find_target(ctx: DoctorContext) -> None:
    """What is examined: the launched server or ``--url`` (its URL, log, models, the served
    model name), recorded in ``res.target``."""
    cfg, server, variant = ctx.cfg, ctx.server, ctx.variant
    if server is not None:
        ctx.url = server.url
        ctx.log_path = Path(server.log_path) if server.log_path else None
    else:
        ctx.url, ctx.log_path = str(cfg.url).rstrip("/"), Path(cfg.log) if cfg.log else None
    # read once: both inspect stages look at the same file (or neither does)
    ctx.readable_log = ctx.log_path if ctx.log_path is not None and ctx.log_path.exists() else None
    models = ctx.models = served_models(ctx.url)
    ctx.served = (
        cfg.served_model
        or (server.model if server is not None else None)
        or (models[0].id if models else None)
    )
    engine = (
        cfg.engine
        or (variant.engine if variant is not None else None)
        or (engine_of(models[0]) if models else None)
    )
    ctx.res.target = Target(
        url=ctx.url,
        model=ctx.served,
        variant=cfg.variant,
        log_path=str(ctx.log_path) if ctx.log_path else None,
        launched=server is not None,
        engine=engine,
    )


def hardware_stage(ctx: DoctorContext) -> None:
    res = ctx.res
    with ctx.rec.stage("hardware") as st:
        res.hardware, notes = describe_hardware(ctx.cfg)
        res.assumptions += notes
        st.message = res.hardware.description


def predict_stage(ctx: DoctorContext, name: str = "predict") -> None:
    cfg, res, variant = ctx.cfg, ctx.res, ctx.variant
    with ctx.rec.stage(name) as st:
        if res.hardware is None:  # the hardware stage failed (its stage says why)
            raise CeilingError("no hardware to predict for", fix="see the hardware stage")
        # a llama.cpp target: its GGUF (never predicted as if it were vLLM); else None
        gguf = target_gguf(cfg, variant, res.target.engine, res.facts, res.target.url)
        model_dir = find_model_dir(cfg, variant, ctx.models)
        exp = expect(cfg, res.hardware, model_dir, ctx.served, res.facts, variant, gguf=gguf)
        res.prediction, res.model, res.prediction_note = exp.prediction, exp.model, exp.note
        res.assumptions += exp.assumptions
        tok_s = exp.prediction.decode_tok_s_per_stream
        st.message = (
            f"{exp.predictor}: {tok_s:.4g} tok/s per stream expected"
            if exp.prediction.expected_tok_s is not None
            else f"{exp.predictor}: bound {tok_s:.4g} tok/s per stream"
            + ("" if gguf else " (predict's GPU model does not apply)")
        )


def acceptance_predict(ctx: DoctorContext) -> None:
    if _counted_acceptance(ctx.res):  # the engine's counters over the run: predict with them
        predict_stage(ctx, "predict (measured acceptance)")


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


def attribute_stage(ctx: DoctorContext) -> None:
    res = ctx.res
    with ctx.rec.stage("attribute") as st:
        res.levels = level_attributions(ctx.cfg, res)
        res.measured = measured_step(res.bench.get("single"))
        res.attribution = attribution(res, res.measured)
        st.message = res.attribution.bound_by if res.attribution else "no decode measurement"


def verdict_stage(ctx: DoctorContext) -> None:
    res = ctx.res
    failed = None if res.server_died else bench_failure(res)
    if failed:  # no verdict from a failed run: the flow says what failed instead
        ctx.rec.skip("verdict", f"no verdict: {failed[1]}")
        return
    with ctx.rec.stage("verdict") as st:
        split, why_not = _step_gap(ctx.cfg, res)
        if split is not None and split.server is not None:
            res.findings.append(server_cost_finding(split.server))
        res.verdict = verdict(ctx.cfg, res, split)
        if split is not None or why_not:  # else the engine has no split: as for any run
            st.message = split.sentence if split is not None else why_not


def _step_gap(cfg: DoctorConfig, res: DoctorResult) -> tuple[BandwidthGap | None, str]:
    """The engine's own split of the single-stream step (its adapter's ``step_gap``: llama-server
    on a GPU), or why there is none. A split that cannot be made (its GGUF not readable here, a
    bad evidence file) leaves the verdict on the attribution and says why in the stage line;
    --llama-bench given for a run with no split is refused there rather than ignored (--profile
    is every engine's: its hardware part fed the prediction)."""
    facts, hw, m = res.facts, res.hardware, res.measured
    evidence = {"llama_bench": cfg.llama_bench, "profile": cfg.profile}
    try:
        split = None
        if facts is not None and facts.engine and hw is not None and m is not None:
            engine = get_engine(facts.engine)
            split = engine.step_gap(facts, hw, m.step_ms, cfg.single_context, evidence)
        # --profile is every engine's (its hardware part fed the prediction): not refused
        if split is None and cfg.llama_bench:
            raise CeilingError(
                "--llama-bench: llama-bench's rows apply to a llama-server run on a GPU",
                fix="drop it, or run the doctor on llama-server",
            )
    except CeilingError as e:
        return None, f"no step split of the engine's own: {e}" + (f" ({e.fix})" if e.fix else "")
    return split, ""


def inspect_stage(ctx: DoctorContext, name: str) -> None:
    cfg, res, log_path = ctx.cfg, ctx.res, ctx.readable_log
    if log_path is None:
        ctx.rec.skip(name, "no log file (pass --log with --url)")
        return
    with ctx.rec.stage(name) as st:
        res.facts, res.findings = inspect_run(
            log_path,
            res.target.engine,
            res.hardware,
            res.bench,
            concurrency=max(cfg.concurrency or [1]),
            request_tokens=cfg.input_len + cfg.max_tokens,
            env=ctx.variant.env if ctx.variant is not None else None,
        )
        st.message = f"{len(res.findings)} findings"
