"""CLI command ``ceiling trace FILE...`` (thin: parse options, call the library, print)."""

from __future__ import annotations

from pathlib import Path

import typer

# typer vendors click (typer._click) and its groups take that Context: no public alias exists
from typer import _click
from typer.core import TyperGroup

from ceiling.cli._vocab import ServerEngine, renamed


class _TraceGroup(TyperGroup):
    """``ceiling trace FILE...`` reads traces, ``ceiling trace capture --url ...`` records one:
    a first argument that names no subcommand is a file of the default command (``read``)."""

    def parse_args(self, ctx: _click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["read", *args]
        return super().parse_args(ctx, args)


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""
    group = typer.Typer(
        cls=_TraceGroup,
        no_args_is_help=True,
        help="An engine's own profiler traces: read them (FILE...), or record one (capture)."
        "\n\n\b\nExamples:\n  ceiling trace vllm_rank0.pt.trace.json.gz\n"
        "  ceiling trace capture --url http://127.0.0.1:8000 --trace-dir /tmp/vllm-traces",
    )
    group.command("read")(trace)
    group.command("capture")(capture)
    app.add_typer(group, name="trace")


def trace(
    files: list[str] = typer.Argument(..., help="torch-profiler traces, one per rank (.json[.gz])"),
    engine: ServerEngine | None = typer.Option(
        None, "--engine", help="the engine whose kernel table to use (default: the trace's)"
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
    out: Path = typer.Option(None, "--out", dir_okay=False, help="write the report as JSON here"),
    profile_out: Path | None = typer.Option(
        None,
        "--profile-out",
        dir_okay=False,
        help="write the trace as a profile for `predict --profile`",
    ),
    report: Path | None = typer.Option(
        None,
        "--report",
        dir_okay=False,
        help="write the report section here (.md, or .html with the bar plot)",
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
        out=str(out) if out is not None else None,
        profile_out=str(profile_out) if profile_out is not None else None,
        report=str(report) if report is not None else None,
        batch=batch,
        context=context,
    )
    show.report(rep, json_out)


def capture(
    url: str = typer.Option(..., "--url", help="A running server (vLLM, SGLang)."),
    steps: int = typer.Option(32, "--steps", help="Decode steps in the window."),
    streams: int = typer.Option(1, "--streams", help="Generations running across the window."),
    ranks: int = typer.Option(1, "--ranks", help="Trace files to wait for (one per rank)."),
    engine: ServerEngine | None = typer.Option(
        None, "--engine", help="The server's engine: vllm or sglang (default: the server's)."
    ),
    engine_version: str = typer.Option(
        None,
        "--engine-version",
        help="The server's engine version (default: what its /version says, else newest form).",
    ),
    served_model: str = typer.Option(
        None, "--served-model", help="Served model name (default: the first)."
    ),
    old_model: str = typer.Option(
        None, "--model", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
    ),
    trace_dir: Path = typer.Option(
        None,
        "--trace-dir",
        file_okay=False,
        help="Where the server writes traces (vLLM: its torch_profiler_dir).",
    ),
    out_dir: Path = typer.Option(
        Path("ceiling-out/trace"), "--out-dir", file_okay=False, help="Output directory."
    ),
    old_out: Path = typer.Option(
        None, "--out", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print capture.json on stdout."),
) -> None:
    """Record a window of steady decode steps through the server's own profiler (its
    /start_profile and /stop_profile), with long generations running across it and no prefill
    inside, then read the files back and split them by op class.

    \b
    Examples:
      ceiling trace capture --url http://127.0.0.1:8000 --trace-dir /tmp/vllm-traces
      ceiling trace capture --url http://127.0.0.1:30000 --engine sglang --steps 16

    A server started without its profiler: the flag or variable that turns it on is printed
    (vLLM: --profiler-config). docs/trace.md. Exit codes: 0 done (recorded or said why not),
    2 bad input, 4 server unreachable.
    """
    from ceiling.flows.trace_capture import capture as record
    from ceiling.render import trace as show

    model = renamed(served_model, old_model, "trace capture --model", "--served-model")
    out = renamed(out_dir, old_out, "trace capture --out", "--out-dir")
    res = record(
        url,
        out,
        steps=steps,
        streams=streams,
        ranks=ranks,
        engine=engine,
        engine_version=engine_version,
        model=model,
        trace_dir=trace_dir,
    )
    show.capture(res, json_out)
