"""CLI command ``ceiling trace FILE...`` (thin: parse options, call the library, print)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
    app.command("trace")(trace)


def trace(
    files: list[str] = typer.Argument(..., help="torch-profiler traces, one per rank (.json[.gz])"),
    engine: str = typer.Option(
        None, "--engine", help="vllm | sglang | llamacpp: its kernel table (default: the trace's)"
    ),
    window: str = typer.Option(
        None, "--window", help="START:END ms from the trace's start: only steps inside it"
    ),
    model: str = typer.Option(
        None, "--model", help="predict this model too and set its figures beside the trace's"
    ),
    gpu: str = typer.Option(None, "--gpu", help="with --model: the GPU (catalog name)"),
    tp: int = typer.Option(1, "--tp", min=1, help="with --model: tensor parallel size"),
    batch: int = typer.Option(
        None, "--batch", min=1, help="sequences per step (default: the engine's annotation)"
    ),
    context: int = typer.Option(
        None, "--context", min=1, help="context per sequence (default: annotation, else 1024)"
    ),
    out: str = typer.Option(None, "--out", help="write the report as JSON here"),
    profile_out: str = typer.Option(
        None, "--profile-out", help="write the trace as a profile for `predict --profile`"
    ),
    report: str = typer.Option(
        None, "--report", help="write the report section here (.md, or .html with the bar plot)"
    ),
    json_out: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Measured split of an engine's decode step from its own profiler trace: per op class
    (GEMM, attention, collectives by implementation, norms, sampling, copies, ...) and GPU
    idle, per step summing to the measured step; top kernels; unmatched kernels by name.

    \b
    Examples:
      ceiling trace vllm_trace_rank0.json.gz
      ceiling trace r0.json.gz r1.json.gz --model llama-3.1-8b --gpu h200 --tp 2
      ceiling trace t.json.gz --profile-out prof.json && ceiling predict ... --profile prof.json

    docs/trace.md. Exit codes: 0 done, 2 bad input (a file that is not a trace, no step).
    """
    from ceiling.render import trace as show
    from ceiling.trace.analyse import analyse, request_for

    rep = analyse(
        files,
        engine=engine,
        window=window,
        request=request_for(model, gpu, tp, engine),
        out=out,
        profile_out=profile_out,
        report=report,
        batch=batch,
        context=context,
    )
    show.report(rep, json_out)
