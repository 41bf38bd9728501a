"""What ``ceiling bench`` and ``ceiling compare`` print (Rich), in 80 columns.

bench: a latency table (each statistic its own column: a ``p99`` column shows the p99) and a
throughput table, then the server's /metrics beside the client's, loop lag, warnings. compare:
one row per (B file, level); the files are named ``B1``, ``B2``... in the table and by a legend
under it, so a long file name never pushes the verdict out of the line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from ceiling.fmt import pct

if TYPE_CHECKING:
    from rich.console import Console

    from ceiling.bench.compare import Comparison
    from ceiling.bench.results import LevelResult, RunResult

#: (header, LevelResult field) of bench's latency table, in ms
LATENCY_COLUMNS = (
    ("TTFT mean", "mean_ttft_ms"),
    ("TTFT p99", "p99_ttft_ms"),
    ("TPOT mean", "mean_tpot_ms"),
    ("TPOT p99", "p99_tpot_ms"),
    ("ITL p99", "p99_itl_ms"),
)


def _f(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _ci(lv: LevelResult, key: str) -> str:
    iv = lv.ci.get(key)
    if iv is None or iv.low is None or iv.high is None:
        return "-"
    return f"{iv.low:.1f}-{iv.high:.1f}"


def _level(lv: LevelResult) -> str:
    return f"c={lv.concurrency}" if lv.concurrency is not None else f"{lv.request_rate:g} req/s"


def render_result(result: RunResult, console: Console, path: str | None = None) -> None:
    """Latency and throughput per level, server-vs-client overhead, warnings."""
    title = f"{result.mode} | {result.model_id} @ {result.url}{result.endpoint}"
    if result.partial:
        title += " | PARTIAL"
    console.print(escape(title), overflow="fold")
    lat = Table(title="latency (ms)", title_justify="left")
    lat.add_column("level", justify="right")
    lat.add_column("ok/failed", justify="right")
    for header, _ in LATENCY_COLUMNS:
        lat.add_column(header, justify="right")
    for lv in result.levels:
        lat.add_row(
            _level(lv),
            f"{lv.completed}/{lv.failed}",
            *(_f(getattr(lv, key)) for _, key in LATENCY_COLUMNS),
        )
    console.print(lat)
    tput = Table(title="throughput (tok/s)", title_justify="left")
    for col in ("level", "decode per stream", "95% CI", "output", "steady state"):
        tput.add_column(col, justify="right")
    for lv in result.levels:
        tput.add_row(
            _level(lv),
            _f(lv.decode_tok_s_per_stream, "{:.1f}"),
            _ci(lv, "decode_tok_s_per_stream"),
            _f(lv.output_throughput, "{:.1f}"),
            _f(lv.steady_state_output_throughput, "{:.1f}"),
        )
    console.print(tput)
    for lv in result.levels:
        if not lv.slo:
            continue
        checks = "; ".join(
            f"{c.slo}: {_f(c.value_ms)} ms {'met' if c.met else '[red]MISSED[/red]'}"
            for c in lv.slo
        )
        console.print(
            f"{_level(lv)}: goodput {_f(lv.request_goodput)} req/s ({lv.good_completed}/"
            f"{lv.completed} requests met every SLO); {checks}"
        )
    if result.capacity is not None:
        _capacity_lines(result, console)
    sm = result.server_metrics or {}
    if sm.get("available"):
        parts = []
        for q, row in sm["quantities"].items():
            if row.get("overhead_ms") is not None:
                parts.append(
                    f"{q} server {row['server_mean_ms']:.2f} / client "
                    f"{row['client_mean_ms']:.2f} ms ({row['overhead_ms']:+.2f})"
                )
        if parts:
            console.print("server /metrics vs client: " + "; ".join(parts))
    lag = result.loop_lag_ms
    if lag.get("p99") is not None:
        console.print(f"client loop lag: mean {lag['mean']:.3f} ms, p99 {lag['p99']:.3f} ms")
    for n in result.notes:
        console.print(f"note: {escape(n)}")
    for w in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    if path:
        console.print(f"result: {escape(str(path))}", overflow="fold")


def _capacity_lines(result: RunResult, console: Console) -> None:
    cap = result.capacity
    assert cap is not None
    if cap.knee_rate is None:
        console.print(f"[red]capacity: no rate met the SLOs[/red] ({escape(cap.stopped)})")
    else:
        above = f", {cap.first_failing_rate:g} req/s did not" if cap.first_failing_rate else ""
        binds = f"; binding SLO: {cap.binding_slo}" if cap.binding_slo else ""
        console.print(
            f"[bold]capacity: {cap.knee_rate:.3g} req/s within the SLOs[/bold]{above}"
            f"{escape(binds)} ({escape(cap.stopped)}, tolerance {cap.tolerance:.0%})"
        )
    console.print(f"rule: {escape(cap.level_rule)}", overflow="fold")


def render_comparison(comp: Comparison, console: Console) -> None:
    """One row per (B file, level) with delta, interval, basis and verdict; B files by legend."""
    labels: list[str] = []
    for r in comp.rows:
        if r.label_b not in labels:
            labels.append(r.label_b)
    table = Table(
        title=f"{escape(comp.metric)}: against {escape(comp.baseline)}", title_justify="left"
    )
    for col in ("B", "level", "A", "B value", "delta %", "95% CI %", "basis"):
        table.add_column(col, justify="right")
    table.add_column("verdict")
    notes: list[Any] = []
    for r in comp.rows:
        ci = (
            f"{pct(r.ci_pct[0], signed=True, unit='')} to {pct(r.ci_pct[1], signed=True, unit='')}"
            if r.ci_pct
            else "-"
        )
        table.add_row(
            f"B{labels.index(r.label_b) + 1}",
            "-" if r.concurrency is None else f"c={r.concurrency}",
            _f(r.a),
            _f(r.b),
            "-" if r.delta_pct is None else pct(r.delta_pct, signed=True, unit=""),
            ci,
            f"{r.basis} ({r.repeats[0]}/{r.repeats[1]})" if r.basis == "repeats" else r.basis,
            escape(r.verdict),
        )
        if r.note and r.note not in notes:
            notes.append(r.note)
    console.print(table)
    for i, label in enumerate(labels, 1):
        console.print(f"B{i}: {escape(label)}", overflow="fold")
    for n in notes:
        console.print(f"note: {escape(n)}")
    for w in comp.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
