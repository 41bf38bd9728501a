"""Human-readable tables for ``ceiling bench`` and ``ceiling compare`` (Rich)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from rich.console import Console

    from ceiling.bench.compare import Comparison
    from ceiling.bench.results import LevelResult, RunResult


def _f(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _ci(lv: LevelResult, key: str) -> str:
    iv = lv.ci.get(key)
    if iv is None or iv.low is None or iv.high is None:
        return ""
    return f" [{iv.low:.1f}, {iv.high:.1f}]"


def render_result(result: RunResult, console: Console, path: str | None = None) -> None:
    """Per-level table, server-vs-client overhead, warnings."""
    title = f"{result.mode} | {result.model_id} @ {result.url}{result.endpoint}"
    if result.partial:
        title += " | PARTIAL"
    table = Table(title=title, title_justify="left")
    for col in (
        "level",
        "ok/failed",
        "TTFT ms mean/p99",
        "TPOT ms mean",
        "ITL ms p99",
        "decode tok/s/stream [95% CI]",
        "output tok/s",
        "steady tok/s",
    ):
        table.add_column(col, justify="right")
    for lv in result.levels:
        level = (
            f"c={lv.concurrency}" if lv.concurrency is not None else f"{lv.request_rate:g} req/s"
        )
        table.add_row(
            level,
            f"{lv.completed}/{lv.failed}",
            _f(lv.mean_ttft_ms),
            _f(lv.mean_tpot_ms),
            _f(lv.p99_itl_ms),
            _f(lv.decode_tok_s_per_stream, "{:.1f}") + _ci(lv, "decode_tok_s_per_stream"),
            _f(lv.output_throughput, "{:.1f}"),
            _f(lv.steady_state_output_throughput, "{:.1f}"),
        )
    console.print(table)
    for lv in result.levels:
        if not lv.slo:
            continue
        level = (
            f"c={lv.concurrency}" if lv.concurrency is not None else f"{lv.request_rate:g} req/s"
        )
        checks = "; ".join(
            f"{c.slo}: {_f(c.value_ms)} ms {'met' if c.met else '[red]MISSED[/red]'}"
            for c in lv.slo
        )
        console.print(
            f"{level}: goodput {_f(lv.request_goodput)} req/s ({lv.good_completed}/"
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
                    f"{row['client_mean_ms']:.2f} ms (+{row['overhead_ms']:.2f})"
                )
        if parts:
            console.print("server /metrics vs client: " + "; ".join(parts))
    lag = result.loop_lag_ms
    if lag.get("p99") is not None:
        console.print(f"client loop lag: mean {lag['mean']:.3f} ms, p99 {lag['p99']:.3f} ms")
    for w in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    if path:
        console.print(f"result: {escape(str(path))}")


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
    console.print(f"rule: {escape(cap.level_rule)}")


def render_comparison(comp: Comparison, console: Console) -> None:
    """One row per (B file, level) with delta, interval, basis and verdict."""
    table = Table(title=f"{comp.metric}: against {comp.baseline}", title_justify="left")
    for col in ("B", "level", "A", "B value", "delta %", "95% CI %", "basis", "verdict"):
        table.add_column(col, justify="right")
    notes: list[Any] = []
    for r in comp.rows:
        ci = f"[{r.ci_pct[0]:+.2f}, {r.ci_pct[1]:+.2f}]" if r.ci_pct else "-"
        table.add_row(
            r.label_b,
            "-" if r.concurrency is None else f"c={r.concurrency}",
            _f(r.a),
            _f(r.b),
            _f(r.delta_pct, "{:+.2f}"),
            ci,
            f"{r.basis} ({r.repeats[0]}/{r.repeats[1]})" if r.basis == "repeats" else r.basis,
            r.verdict,
        )
        if r.note and r.note not in notes:
            notes.append(r.note)
    console.print(table)
    for n in notes:
        console.print(f"note: {escape(n)}")
    for w in comp.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
