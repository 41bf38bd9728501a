"""CLI commands of the probe group (thin: parse options, call the library, render)."""

from __future__ import annotations

from pathlib import Path

import typer

from ceiling.choices import CalibrateEngine, CommBackend, CommDtype
from ceiling.cli._vocab import renamed


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""

    @app.command("probe")
    def probe_cmd(
        json_: bool = typer.Option(False, "--json", help="Print the topology as JSON."),
        out: Path | None = typer.Option(
            None, "--out", dir_okay=False, help="Also write the JSON to this file."
        ),
    ) -> None:
        """GPUs, memory, clocks, PCIe, NVLink, GPU-pair links and P2P; CPU sockets/NUMA.

        \b
        Example:
          ceiling probe --out ceiling-out/probe.json
        """
        from ceiling.probe.commands import probe_to
        from ceiling.render import probe as show

        show.topology(probe_to(out), json_)

    @app.command("telemetry")
    def telemetry_cmd(
        duration: float = typer.Option(10.0, "--duration", help="Seconds to sample."),
        interval_ms: float = typer.Option(
            50.0, "--interval-ms", help="Sampling interval, 10-1000 ms.", metavar="MS"
        ),
        json_: bool = typer.Option(False, "--json", help="Print summary + series as JSON."),
        out: Path | None = typer.Option(
            None, "--out", dir_okay=False, help="Write summary + series here."
        ),
    ) -> None:
        """Sample NVML (PCIe TX/RX, SM/mem util, clocks, power, temperature) for a while.

        \b
        Example:
          ceiling telemetry --duration 30 --interval-ms 100 --out telemetry.json
        """
        from ceiling.probe.commands import telemetry_to
        from ceiling.render import probe as show

        show.telemetry(telemetry_to(duration, interval_ms, out), json_)

    @app.command("commbench")
    def commbench_cmd(
        world_sizes: str | None = typer.Option(
            None, "--world-sizes", help="e.g. 2,4,8 (default 2..#GPUs; 2 on CPU)."
        ),
        sizes: str = typer.Option(
            "1K..64M", "--sizes", help="'1K..64M' (powers of 2) or '1K,14K,1M'."
        ),
        preset: list[str] = typer.Option(
            [],
            "--preset",
            metavar="PRESET",
            help="Preset or group from data/commbench.yaml (repeatable): default, ring, tree, ll, ll128, simple, p2p-off, channels16-buff16m, issue7 ...",
        ),
        old_variant: list[str] = typer.Option(
            [], "--variant", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
        ),
        env: list[str] = typer.Option(
            [], "--env", help="Custom variant KEY=V[,KEY=V] (repeatable)."
        ),
        backend: CommBackend = typer.Option(
            "auto", "--backend", help="Collective backend (auto: NCCL on GPUs, else gloo)."
        ),
        buffer_dtype: CommDtype | None = typer.Option(
            None,
            "--buffer-dtype",
            help="The buffers' element type (default: bfloat16 on GPU, float32 on CPU).",
        ),
        # `--dtype` names a compute dtype elsewhere (calibrate, sanity): renamed here
        old_dtype: str | None = typer.Option(
            None, "--dtype", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
        ),
        no_graph: bool = typer.Option(False, "--no-graph", help="Skip the CUDA-graph measurement."),
        model: str | None = typer.Option(
            None,
            "--model",
            help="Add the per-token allreduce cost of this model (TP = world size).",
        ),
        batch: str = typer.Option("1", "--batch", help="Decode batch sizes for --model, e.g. 1,8."),
        reps: int = typer.Option(5, "--reps", help="Timed repetitions per size (median)."),
        budget_ms: float = typer.Option(
            20.0, "--budget-ms", help="Time per repetition per size, ms.", metavar="MS"
        ),
        rank_timeout: float = typer.Option(
            900.0, "--rank-timeout", help="Seconds the ranks of one preset may run."
        ),
        old_timeout: float = typer.Option(
            None, "--timeout", hidden=True, help="Old spelling, kept one release (docs/cli.md)."
        ),
        out: Path | None = typer.Option(
            None, "--out", dir_okay=False, help="Write a hardware profile (collective fits) here."
        ),
        results: Path | None = typer.Option(
            None, "--results", dir_okay=False, help="Write the full result JSON here."
        ),
        merge: Path | None = typer.Option(
            None,
            "--merge",
            dir_okay=False,
            help="Merge into this existing profile (e.g. calibrate's).",
        ),
        json_: bool = typer.Option(False, "--json", help="Print the full result as JSON."),
        quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
    ) -> None:
        """Allreduce latency/bandwidth at decode message sizes, per NCCL setting; alpha-beta fits.

        \b
        Example:
          ceiling commbench --world-sizes 2,4,8 --preset default --preset ll --out profile.json
        """
        from ceiling.errors import CeilingError
        from ceiling.inputs import int_list, model_from_options
        from ceiling.probe.commands import commbench_exit, commbench_to
        from ceiling.probe.commbench import CommbenchConfig
        from ceiling.probe.fit import parse_sizes

        try:
            parsed = parse_sizes(sizes)
        except ValueError as exc:
            raise CeilingError(
                f"bad --sizes {sizes!r}: {exc}", fix="e.g. --sizes 1K..64M"
            ) from None
        if old_variant:
            from ceiling.cli._vocab import deprecated

            deprecated("commbench --variant", "--preset")
        variant = preset + old_variant
        timeout = renamed(rank_timeout, old_timeout, "commbench --timeout", "--rank-timeout")
        dtype = renamed(buffer_dtype, old_dtype, "commbench --dtype", "--buffer-dtype")
        options = dict(
            world_sizes=int_list(world_sizes, "--world-sizes") if world_sizes else None,
            sizes=parsed,
            variants=variant,
            custom_env=env,
            backend=backend,
            dtype=dtype,
            graph=not no_graph,
            model=model,
            batch=int_list(batch, "--batch"),
            reps=reps,
            budget_s=budget_ms / 1000,
            timeout_s=timeout,
        )
        names = {"budget_s": "--budget-ms", "timeout_s": "--rank-timeout", "variants": "--preset"}
        names["dtype"] = "--dtype" if old_dtype is not None else "--buffer-dtype"
        cfg = model_from_options(CommbenchConfig, options, "commbench", names)
        from ceiling.render import probe as show

        res = commbench_to(cfg, out, results, merge, progress=not quiet)
        show.commbench(res, json_)
        raise typer.Exit(commbench_exit(res))

    @app.command("calibrate")
    def calibrate_cmd(
        cpu: bool = typer.Option(
            False, "--cpu", help="Measure the CPU instead (labelled; no GPU needed)."
        ),
        dtype: list[str] = typer.Option(
            [],
            "--dtype",
            help="bf16, fp8, int8 (repeatable; default all the GPU offers).",
            metavar="DTYPE",
        ),
        scale: float = typer.Option(
            1.0,
            "--scale",
            help="Multiply the buffer sizes of data/calibrate.yaml (> 0).",
            metavar="X",
        ),
        out: Path | None = typer.Option(
            None, "--out", dir_okay=False, help="Write the hardware profile here."
        ),
        results: Path | None = typer.Option(
            None, "--results", dir_okay=False, help="Write the full result JSON here."
        ),
        merge: Path | None = typer.Option(
            None,
            "--merge",
            dir_okay=False,
            help="Merge into this existing profile (e.g. commbench's).",
        ),
        json_: bool = typer.Option(False, "--json", help="Print result + profile as JSON."),
        ops: bool = typer.Option(
            False, "--ops", help="Also time each decode op (GEMM, MoE, attention, norm) per family."
        ),
        model: list[str] = typer.Option(
            [], "--model", help="Decode shapes of these models for --ops (repeatable)."
        ),
        tp: int = typer.Option(1, "--tp", min=1, help="Per-rank shapes at this TP for --ops."),
        quiet: bool = typer.Option(False, "--quiet", help="No progress line."),
        engine: CalibrateEngine | None = typer.Option(
            None,
            "--engine",
            help="llamacpp: time llama.cpp's own mat-vec kernels per GGUF weight type "
            "(test-backend-ops perf) into a profile for `predict --engine llamacpp`.",
        ),
        test_backend_ops: Path | None = typer.Option(
            None, "--test-backend-ops", dir_okay=False, help="--engine llamacpp: the binary."
        ),
        from_output: Path | None = typer.Option(
            None,
            "--from-output",
            dir_okay=False,
            help="--engine llamacpp: a recorded `test-backend-ops perf --output sql` run.",
        ),
        gguf: Path | None = typer.Option(
            None, "--gguf", dir_okay=False, help="--engine llamacpp: time this file's types."
        ),
    ) -> None:
        """HBM read/copy bandwidth, decode GEMV bandwidth per dtype, kernel launch cost -> profile.

        With --ops, per-operation microbenchmarks at the models' decode shapes (kernel-family
        fits that `predict --profile` uses per op).

        \b
        Example:
          ceiling calibrate --out profile.json   (then: ceiling predict ... --profile profile.json)
        """
        if engine is not None:
            from ceiling.console import emit_json
            from ceiling.console import out as stdout
            from ceiling.flows.calibrate_llamacpp import calibrate_cli

            prof = calibrate_cli(
                str(test_backend_ops) if test_backend_ops else None,
                str(from_output) if from_output else None,
                str(gguf) if gguf else None,
                str(out) if out else None,
                str(merge) if merge else None,
            )
            if json_:
                emit_json(prof)
            else:
                for r in prof.matvec.values():
                    stdout().print(
                        f"{r.type:<7} {r.shape} mat-vec: {r.time_us:.2f} us, {r.GBps:.0f} GB/s"
                    )
            return
        from ceiling.inputs import model_from_options
        from ceiling.probe.calibrate import CalibrateConfig
        from ceiling.probe.commands import calibrate_to
        from ceiling.render import probe as show

        options = dict(device="cpu" if cpu else "auto", dtypes=dtype or None, scale=scale)
        cfg = model_from_options(CalibrateConfig, options, "calibrate", {"dtypes": "--dtype"})
        ops_cfg = None
        if ops:
            from ceiling.probe.calibrate_ops import DEFAULT_MODELS, OpsConfig

            ops_cfg = OpsConfig(
                device="cpu" if cpu else "auto", models=model or DEFAULT_MODELS, tp=tp
            )
        show.calibrate(calibrate_to(cfg, out, results, merge, ops_cfg, progress=not quiet), json_)
