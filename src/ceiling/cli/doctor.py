"""CLI commands of the doctor group (thin: parse options, call the library, print)."""

from __future__ import annotations

from pathlib import Path

import typer

from ceiling.cli._vocab import ServerEngine, renamed


def _ints(text: str) -> list[int]:
    if text.strip().lower() in ("", "none", "0"):
        return []
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        from ceiling.errors import CeilingError

        raise CeilingError(
            f"--concurrency {text!r} is not a list of integers",
            fix="e.g. --concurrency 1,2,4 (or none)",
        ) from None


def doctor(
    url: str = typer.Option(None, "--url", help="A running OpenAI-compatible server to examine."),
    variant: Path = typer.Option(
        None, "--variant", dir_okay=False, help="A variant file: doctor launches it."
    ),
    log: Path = typer.Option(
        None, "--log", dir_okay=False, help="The running server's log file (with --url)."
    ),
    model: str = typer.Option(
        None, "--model", help="Model directory / config.json / catalog name (default: auto)."
    ),
    old_model_path: str = typer.Option(
        None, "--model-path", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
    ),
    served_model: str = typer.Option(
        None, "--served-model", help="Served model name (default: from /v1/models)."
    ),
    engine: ServerEngine | None = typer.Option(
        None, "--engine", help="Engine of a --url server (default: auto)."
    ),
    gpu: str = typer.Option(None, "--gpu", help="Catalog GPU name (default: probed)."),
    tp: int = typer.Option(None, "--tp", help="Tensor-parallel size of a --url server."),
    cuda_graphs: bool = typer.Option(
        None,
        "--cuda-graphs/--no-cuda-graphs",
        help="Whether the server uses CUDA graphs (default: from the variant/log, else yes).",
    ),
    max_tokens: int = typer.Option(512, "--max-tokens", help="Single-stream generation length."),
    input_len: int = typer.Option(64, "--input-len", help="Prompt length in tokens."),
    repeat: int = typer.Option(3, "--repeat", help="Single-stream repeats (CI across them)."),
    concurrency: str = typer.Option(
        "1,2,4", "--concurrency", help="Short sweep levels, or none.", metavar="N,N,..."
    ),
    concurrency_max_tokens: int = typer.Option(
        128, "--concurrency-max-tokens", help="Generation length in the concurrency sweep."
    ),
    target: float = typer.Option(None, "--target", help="Target decode tok/s per stream."),
    slo: str = typer.Option(
        None,
        "--slo",
        help="Objectives METRIC:STAT<=TIME (as bench's), judged on the concurrency levels: "
        "the verdict gains a capacity line.",
    ),
    no_telemetry: bool = typer.Option(False, "--no-telemetry", help="Do not sample NVML."),
    no_measure_cpu: bool = typer.Option(
        False, "--no-measure-cpu", help="On CPU, use the labelled assumed rates."
    ),
    ready_timeout: float = typer.Option(
        1800.0, "--ready-timeout", help="Seconds the launched engine may take to be ready."
    ),
    old_launch_timeout: float = typer.Option(
        None, "--launch-timeout", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
    ),
    no_sanity: bool = typer.Option(
        False, "--no-sanity", help="Benchmark even if the output is wrong (skip the sanity gate)."
    ),
    trace: bool = typer.Option(
        False,
        "--trace",
        help="Also record the engine's own kernels (its profiler) in windows apart from the "
        "bench: the verdict then uses the measured split.",
    ),
    trace_steps: int = typer.Option(32, "--trace-steps", help="Decode steps per traced window."),
    accept_broken_output: str = typer.Option(
        None,
        "--accept-broken-output",
        metavar="REASON",
        help="Measure even if the sanity gate calls the output broken (the gate still runs; "
        "its verdict and REASON go into the report), e.g. 'random weights: kernel timing only'. "
        "A server told to load random weights (--load-format dummy, in the variant or its log) "
        "needs none: the doctor says so itself.",
    ),
    max_failed_pct: float = typer.Option(
        5.0, "--max-failed-pct", help="Above this share of failed requests (%): no verdict."
    ),
    stall_timeout: float = typer.Option(
        60.0, "--stall-timeout", help="A stream silent this long ends the stage (a finding)."
    ),
    llama_bench: Path = typer.Option(
        None,
        "--llama-bench",
        exists=True,
        dir_okay=False,
        metavar="FILE",
        help="llama-bench -o json of the served GGUF (same settings): the server's own cost "
        "per token becomes a finding (llama-server only).",
    ),
    profile: Path = typer.Option(
        None,
        "--profile",
        exists=True,
        dir_okay=False,
        metavar="FILE",
        help="A measured profile (calibrate / commbench --out): its hardware part feeds the "
        "prediction (as predict --profile); on llama-server its engine.llamacpp entry "
        "(calibrate --engine llamacpp) is what the bandwidth verdict measures against.",
    ),
    old_llamacpp_profile: Path = typer.Option(
        None,
        "--llamacpp-profile",
        exists=True,
        dir_okay=False,
        hidden=True,
        help="Old spelling of --profile, kept one release (docs/cli.md).",
    ),
    out_dir: Path = typer.Option(
        Path("ceiling-out"), "--out-dir", file_okay=False, help="Output directory."
    ),
    old_out: Path = typer.Option(
        None, "--out", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print doctor.json on stdout."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress lines."),
) -> None:
    """Measure a deployment, set it against its expected rate and bound, write a verdict + report.

    \b
    Examples:
      ceiling doctor --variant examples/variants/cpu-tiny.yaml
      ceiling doctor --url http://127.0.0.1:8000 --log server.log --model /models/llama
      ceiling doctor --variant examples/variants/cpu-tiny.yaml --trace

    Every option is checked before anything is launched. API key: a launched variant's own key
    (--api-key / VLLM_API_KEY) is used; for --url, CEILING_API_KEY (else OPENAI_API_KEY) is sent
    as the Bearer token. Keys never reach output or files. Exit codes: 0 ok, 1 no request
    completed, the server died, or its output is broken (sanity gate; nothing benchmarked; report
    written), 2 bad option, 3 the engine did not start,
    4 server unreachable or refused, 130 interrupted (doctor.json written, interrupted: true).
    """
    from ceiling.bench.slo import parse_slos
    from ceiling.console import say
    from ceiling.diagnose.schema import DoctorConfig
    from ceiling.flows import doctor as doctor_flow
    from ceiling.flows.doctor_checks import OPTION_NAMES, outcome
    from ceiling.inputs import model_from_options
    from ceiling.render import doctor as show
    from ceiling.report import render

    model_path = renamed(model, old_model_path, "doctor --model-path", "--model")
    launch_timeout = renamed(
        ready_timeout, old_launch_timeout, "doctor --launch-timeout", "--ready-timeout"
    )
    out = renamed(out_dir, old_out, "doctor --out", "--out-dir")
    profile = renamed(profile, old_llamacpp_profile, "doctor --llamacpp-profile", "--profile")
    options = dict(
        url=url,
        variant=str(variant) if variant else None,
        log=str(log) if log else None,
        model_path=model_path,
        served_model=served_model,
        engine=engine,
        gpu=gpu,
        tp=tp,
        cuda_graphs=cuda_graphs,
        max_tokens=max_tokens,
        input_len=input_len,
        repeat=repeat,
        concurrency=_ints(concurrency),
        concurrency_max_tokens=concurrency_max_tokens,
        target_tok_s=target,
        slo=parse_slos(slo),
        telemetry=not no_telemetry,
        measure_cpu=not no_measure_cpu,
        launch_timeout_s=launch_timeout,
        sanity=not no_sanity,
        trace=trace,
        trace_steps=trace_steps,
        accept_broken_output=accept_broken_output,
        max_failed_pct=max_failed_pct,
        stall_timeout_s=stall_timeout,
        llama_bench=str(llama_bench) if llama_bench else None,
        profile=str(profile) if profile else None,
        out_dir=str(out),
        progress=not (json_out or quiet),
    )
    cfg = model_from_options(DoctorConfig, options, "doctor", OPTION_NAMES)
    res = doctor_flow.run(cfg, report=render)
    code, why = outcome(res)
    show.doctor(res, json_out)
    if why:
        say(f"doctor: {why}; what was measured is in {res.files.get('doctor')}")
    raise typer.Exit(code)


def sweep(
    plan: Path = typer.Argument(..., help="Plan file (YAML) listing the variants."),
    out_dir: Path = typer.Option(
        Path("ceiling-out/sweep"), "--out-dir", file_okay=False, help="Output directory."
    ),
    old_out: Path = typer.Option(
        None, "--out", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the sweep recorded in --out-dir."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print sweep.json on stdout."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress lines."),
) -> None:
    """Run every variant of a plan (preflight first), with a durable ledger and early stop.

    \b
    Example:
      ceiling sweep examples/plans/cpu-tiny.yaml --out-dir ceiling-out/sweep

    Ctrl-C stops the running trial (its engine too) and leaves the ledger resumable: rerun with
    --resume. Without a terminal, each launch prints its start-up phases as lines.
    """
    from ceiling.sweep.plan import load_plan

    out = renamed(out_dir, old_out, "sweep --out", "--out-dir")
    # the plan is read before the flow's imports (the bench client, numpy: about a second on a
    # loaded 2-core box), so a bad plan is refused at once; the flow reads it again
    load_plan(plan)

    from ceiling.console import say
    from ceiling.errors import CeilingError, ExitStatus
    from ceiling.flows import sweep as sweep_flow
    from ceiling.render import doctor as show

    talk = not (json_out or quiet)

    from ceiling.sweep.events import Failed, Repeat, StoppedEarly, TrialEvent

    def on_event(name: str, ev: TrialEvent) -> None:
        if talk and isinstance(ev, Repeat):
            say(f"{name}: repeat {ev.idx}: {ev.tok_s} tok/s")
        elif talk and isinstance(ev, StoppedEarly | Failed):
            why = ev.reason if isinstance(ev, StoppedEarly) else ev.error
            say(f"{name}: {ev.type_}: {why}")

    result = sweep_flow.run(plan, out, resume=resume, on_event=on_event, progress=talk)
    show.sweep(result, out, json_out)
    failed = sweep_flow.sweep_failure(result)
    if failed:  # every variant failed: nothing was measured, the sweep is not "done"
        raise CeilingError(
            failed,
            fix=f"read the variants' errors in {out}/sweep.json",
            exit_code=ExitStatus.FAILED,
        )


def report(
    result: Path = typer.Argument(..., help="doctor.json, sweep.json or a bench result."),
    out_dir: Path = typer.Option(
        None, "--out-dir", file_okay=False, help="Directory (default: beside the file)."
    ),
    old_out: Path = typer.Option(
        None, "--out", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the written paths as JSON."),
) -> None:
    """Render the Markdown and HTML report of a saved doctor, sweep or bench result.

    \b
    Example:
      ceiling report ceiling-out/doctor.json --out-dir /tmp/report
    """
    from ceiling.render import doctor as show
    from ceiling.report import render_file

    out = renamed(out_dir, old_out, "report --out", "--out-dir")
    show.report_paths(render_file(result, out), json_out)


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
    app.command("doctor")(doctor)
    app.command("sweep")(sweep)
    app.command("report")(report)
