"""What the probe commands print: topology, telemetry, commbench, calibrate (Rich tables)."""

from __future__ import annotations

from rich.table import Table

from ceiling.probe.calibrate import CalibrateResult
from ceiling.probe.calibrate_ops import OpsResult
from ceiling.probe.commands import CalibrateRun, TelemetryRun
from ceiling.probe.commbench import CommbenchResult
from ceiling.probe.commbench import table as run_table
from ceiling.probe.topology_model import Topology
from ceiling.render import emit_json, esc, out, table


def _f(v: float | None, fmt: str = "{:g}") -> str:
    return "-" if v is None else fmt.format(v)


def topology(topo: Topology, json_out: bool = False) -> None:
    if json_out:
        emit_json(topo)
        return
    c = out()
    cpu = topo.cpu
    numa = ", ".join(f"node{n.node}: {n.cpus}" for n in cpu.numa_nodes) or "-"
    c.print(
        f"host {esc(topo.host)}: CPU {esc(cpu.model or '?')}, {cpu.sockets or '?'} socket(s), "
        f"{cpu.logical_cpus or '?'} logical CPUs, NUMA {numa}"
    )
    if not topo.gpus:
        c.print(f"{esc(topo.reason)}. CPU-only machine: nothing to probe on the GPU side.")
        return
    c.print(
        f"source: {esc(topo.source)}; driver {esc(topo.driver_version or '?')}"
        + (f", CUDA {esc(topo.cuda_driver_version)}" if topo.cuda_driver_version else "")
    )
    rows = [
        [
            str(g.index),
            esc(g.name + (f" ({g.catalog_name})" if g.catalog_name else "")),
            _f(g.memory_total_GiB, "{:.1f}"),
            f"{_f(g.sm_clock_max_MHz)}/{_f(g.mem_clock_max_MHz)}",
            f"Gen{_f(g.pcie_gen_current)}/{_f(g.pcie_gen_max)} x{_f(g.pcie_width_current)}/{_f(g.pcie_width_max)}",
            _f(g.pcie_GBps_per_direction),
            "n/a" if g.nvlink_active_links is None else str(g.nvlink_active_links),
            _f(g.numa_node),
        ]
        for g in topo.gpus
    ]
    c.print(
        table(
            "GPUs",
            [
                "#",
                "name",
                "GiB",
                "max SM/mem MHz",
                "PCIe cur/max",
                "PCIe GB/s/dir",
                "NVLinks",
                "NUMA",
            ],
            rows,
        )
    )
    if topo.pairs:
        prow = [
            [f"{p.a}-{p.b}", esc(p.connection), _yn(p.p2p), esc(p.p2p_status or "-"), esc(p.link)]
            for p in topo.pairs
        ]
        c.print(table("GPU pairs", ["pair", "connection", "P2P", "P2P status", "link kind"], prow))
    for n in topo.notes:
        c.print(f"note: {esc(n)}")


def _yn(v: bool | None) -> str:
    return "?" if v is None else ("yes" if v else "NO")


def telemetry(run: TelemetryRun, json_out: bool = False) -> None:
    if json_out:
        emit_json(run)
        return
    c, summary = out(), run.summary
    rows = [
        [
            str(g["index"]),
            _f(g["pcie_tx_GBps_mean"], "{:.3f}"),
            _f(g["pcie_rx_GBps_mean"], "{:.3f}"),
            _f(g["link_share_pct"], "{:.2f}"),
            _f(g["sm_util_pct_mean"], "{:.0f}"),
            _f(g["mem_util_pct_mean"], "{:.0f}"),
            f"{_f(g['sm_clock_MHz_mean'], '{:.0f}')}/{_f(g['mem_clock_MHz_mean'], '{:.0f}')}",
            f"{_f(g['power_W_mean'], '{:.0f}')}/{_f(g['power_W_max'], '{:.0f}')}",
            _f(g["temp_C_max"], "{:.0f}"),
        ]
        for g in summary["gpus"]
    ]
    c.print(
        table(
            f"telemetry: {summary['n_samples']} samples over {summary['duration_s']} s",
            [
                "GPU",
                "PCIe TX GB/s",
                "RX GB/s",
                "% link",
                "SM %",
                "mem %",
                "SM/mem MHz",
                "W mean/max",
                "max C",
            ],
            rows,
        )
    )
    c.print(esc(summary["verdict"]))


def commbench(res: CommbenchResult, json_out: bool = False) -> None:
    if json_out:
        emit_json(res)
        return
    c = out()
    for run in res.runs:
        env = ", ".join(f"{k}={v}" for k, v in run.env.items()) or "defaults"
        title = f"allreduce {run.backend} world={run.world_size} variant={run.variant} ({env})"
        if run.link:
            title += f" link={run.link}"
        if run.error:
            c.print(f"{esc(title)}: FAILED: {esc(run.error)}")
            continue
        header, rows = run_table(run)
        c.print(table(esc(title), header, [[esc(cell) for cell in r] for r in rows]))
        for f in run.fits:
            mode = "graph" if f.in_cuda_graph else "eager"
            c.print(f"  fit ({mode}): alpha {f.alpha_us:.2f} us, beta {f.beta_GBps:.3g} GB/s")
    mc = res.model_cost
    if mc is not None:
        rows = [
            [
                esc(r.variant),
                str(r.world_size),
                "graph" if r.in_cuda_graph else "eager",
                str(r.batch),
                str(r.message_bytes),
                f"{r.latency_us:.2f}",
                f"{r.per_token_ms:.3f}",
                _f(r.delta_vs_default_pct, "{:+.1f}"),
            ]
            for r in mc.rows
        ]
        c.print(
            table(
                f"per-token allreduce cost of {esc(mc.model)} (hidden {mc.hidden}, {mc.layers} layers "
                f"x 2 = {mc.allreduces_per_token} allreduces per token, TP = world size)",
                ["variant", "TP", "mode", "B", "bytes", "us each", "ms/token", "vs default %"],
                rows,
            )
        )
    for n in res.notes:
        c.print(f"note: {esc(n)}")


def calibrate(run: CalibrateRun, json_out: bool = False) -> None:
    """The measurements, the fits, and (``--ops``) the per-operation fits."""
    if json_out:
        emit_json(run)
        return
    _calibrate(run.result, run.datasheet_GBps)
    if run.ops is not None:
        _calibrate_ops(run.ops)


def _calibrate(res: CalibrateResult, datasheet_GBps: float | None) -> None:
    c = out()
    c.print(f"{esc(res.device_name)} ({esc(res.device)}), torch {esc(res.torch_version)}")
    share = (
        f" = {100 * res.mem_read_GBps / datasheet_GBps:.0f} % of datasheet {datasheet_GBps:g}"
        if datasheet_GBps
        else ""
    )
    c.print(f"read bandwidth {res.mem_read_GBps:g} GB/s{share}; copy {res.copy_GBps:g} GB/s (r+w)")
    rows = [
        [
            esc(p.dtype),
            str(p.batch),
            str(p.padded_batch),
            f"{p.weight_bytes / 1e9:.2f}",
            f"{p.time_us:.1f}",
            f"{p.bw_GBps:g}",
            f"{p.tflops:g}",
        ]
        for p in res.gemv
    ]
    c.print(
        table(
            "decode-shaped GEMV / skinny GEMM",
            ["dtype", "batch", "rows run", "GB", "us", "GB/s", "TFLOP/s"],
            rows,
        )
    )
    for k, v in res.skipped.items():
        c.print(f"{esc(k)}: not measured: {esc(v)}")
    if res.gemv_fit is not None:
        f = res.gemv_fit
        pts = ", ".join(f"{b / 1e6:.0f} MB {t:g} us" for b, t in f.points)
        c.print(
            f"one {esc(f.dtype)} GEMV at batch {f.batch}: {f.fixed_us:g} us fixed + bytes / "
            f"{f.bw_GBps:g} GB/s ({pts})"
        )
    c.print(
        f"kernel launch: {res.launch_us_eager:g} us eager"
        + ("" if res.launch_us_graph is None else f", {res.launch_us_graph:g} us in a CUDA graph")
    )
    for n in res.notes:
        c.print(f"note: {esc(n)}")


def _calibrate_ops(res: OpsResult) -> None:
    """Per-op microbenchmarks: each family's fit, then the points."""
    c = out()
    t = Table(title="per-operation fits (t = t0 + bytes / bw, batch 1)", title_justify="left")
    for col in ("family", "t0 us", "bw GB/s", "points", "kernel"):
        t.add_column(col, justify="right" if col not in ("family", "kernel") else "left")
    for f in res.fits:
        t.add_row(
            esc(f.family),
            f"{f.t0_us:.2f}",
            f"{f.bw_GBps:.0f}" if f.bw_GBps else "-",
            str(len(f.points)),
            "engine's" if f.engine_kernel else "stand-in",
        )
    c.print(t)
    pts = Table(title="per-operation points", title_justify="left")
    for col in ("family", "shape", "batch", "MB", "us", "GB/s"):
        pts.add_column(col, justify="left" if col in ("family", "shape") else "right")
    for p in res.points:
        pts.add_row(
            esc(p.family),
            esc(p.label),
            str(p.batch),
            f"{p.nbytes / 1e6:.2f}",
            f"{p.us:.2f}",
            f"{p.nbytes / p.us / 1e3:.0f}" if p.us > 0 else "-",
        )
    c.print(pts)
    for k, v in res.skipped.items():
        c.print(f"[dim]{esc(k)} not measured: {esc(v)}[/dim]")
