"""What ``ceiling predict`` prints: Rich tables (breakdown, batch curve, what-if, catalogs)."""

from __future__ import annotations

from pathlib import Path

from ceiling.console import emit_json, out
from ceiling.fmt import pct, share
from ceiling.predict.api import Prediction
from ceiling.predict.schema import LlamaCppDetails


def print_prediction(p: Prediction) -> None:
    """Headline, component breakdown, batch curve, prefill, what-if table and assumptions.
    Names and notes are escaped: a model or GPU file named ``[x]`` is printed as it is."""
    from rich.markup import escape as esc
    from rich.table import Table

    con = out()
    m, h, d = p.model, p.hardware, p.deployment
    where = (
        f"{h.gpus} x {esc(str(h.gpu))}" + (f" over {esc(h.link)}" if h.link else "")
        if h.kind == "gpu"
        else f"CPU {esc(str(h.cpu))}"
    )
    con.print(
        f"[bold]{esc(m.name)}[/bold] on {where} "
        f"(tp={d.tp} pp={d.pp} ep={d.ep} dp={d.dp}{f' dcp={d.dcp}' if d.dcp > 1 else ''}, "
        f"{esc(d.engine)}, "
        f"allreduce {esc(d.allreduce_impl)}, graphs {'on' if d.cuda_graphs else 'off'})"
    )
    b = p.bound
    con.print(
        f"decode at batch {p.batch}, context {p.context}: "
        f"[bold]expected {p.decode_ms_per_token:.2f} ms/token = {p.decode_tok_s_per_stream:.1f} "
        f"tok/s per stream[/bold]"
        + (
            f"  |  bound {b.decode_ms_per_token:.2f} ms = {b.decode_tok_s_per_stream:.1f} tok/s "
            f"(expected reaches {share(p.decode_tok_s_per_stream / b.decode_tok_s_per_stream)})"
            if b and b.decode_tok_s_per_stream
            else ""
        )
        + (f", {p.aggregate_tok_s:.0f} tok/s aggregate" if p.batch > 1 or d.dp > 1 else "")
    )
    iv = p.expected.interval if p.expected is not None else None
    if iv is not None:
        con.print(
            f"  {iv.coverage * 100:.0f} % interval: {iv.step_ms_low:.2f}-{iv.step_ms_high:.2f} "
            f"ms/token = {iv.tok_s_low:.1f}-{iv.tok_s_high:.1f} tok/s per stream "
            f"[dim](wider for: {esc(iv.reason)})[/dim]"
        )
    if p.details.llamacpp is not None:
        _llamacpp_line(p.details.llamacpp)
    t = Table(title="decode step breakdown (ms per token)", title_justify="left")
    t.add_column("component", overflow="fold")
    t.add_column("expected", justify="right")
    t.add_column("share", justify="right")
    t.add_column("bound", justify="right")
    t.add_column("fundamental / configurable", overflow="fold")
    bc = b.components_ms if b else {}
    for name, ms in sorted(p.components_ms.items(), key=lambda kv: -kv[1]):
        t.add_row(
            esc(name),
            f"{ms:.3f}",
            share(p.component_share[name]),
            f"{bc.get(name, 0.0):.3f}",
            esc(p.component_kind.get(name, "")),
        )
    t.add_row(
        "[bold]total[/bold]",
        f"[bold]{p.decode_ms_per_token:.3f}[/bold]",
        "100 %",
        f"[bold]{b.decode_ms_per_token:.3f}[/bold]" if b else "",
        "",
    )
    con.print(t)
    if p.expected is not None:
        _op_table(p)
    mem = p.memory_GiB_per_gpu
    if p.kv_capacity_tokens is not None:
        con.print(
            f"memory per GPU: weights {mem['weights']:.1f} GiB + KV {mem['kv']:.2f} GiB of "
            f"{mem['usable']:.1f} usable ({'fits' if p.fits_in_memory else 'DOES NOT FIT'}); "
            f"KV capacity {p.kv_capacity_tokens:,} tokens = {p.max_batch_at_context} sequences "
            f"at context {p.context}"
        )
    if p.prefill:
        con.print(
            f"prefill of {int(p.prefill['prompt_len'])} tokens: {p.prefill['prefill_ms']:.1f} ms "
            f"(TTFT ~{p.prefill['ttft_ms']:.1f} ms)"
        )
    if p.batch_curve:
        bt = Table(title="batch curve (up to KV capacity)", title_justify="left")
        for col in ("batch", "ms/step (80 %)", "tok/s per stream (80 %)", "tok/s aggregate"):
            bt.add_column(col, justify="right")
        for pt in p.batch_curve:  # the interval in the cell: 80 columns hold four, not six
            bt.add_row(
                str(pt.batch),
                f"{pt.step_ms:.2f}" + _range(pt.step_ms_low, pt.step_ms_high, 2),
                f"{pt.tok_s_per_stream:.1f}"
                + _range(pt.tok_s_per_stream_low, pt.tok_s_per_stream_high, 1),
                f"{pt.aggregate_tok_s:.0f}",
            )
        con.print(bt)
    if p.what_if:
        _what_if_table(p)
    con.print("[dim]assumptions:[/dim]")
    for a in p.assumptions:
        con.print(f"[dim]  - {esc(a)}[/dim]")


def _what_if_table(p: Prediction) -> None:
    """Ranked what-ifs; a change's note is a numbered line under the table (80 columns)."""
    from rich.markup import escape as esc
    from rich.table import Table

    wt = Table(
        title="what if (one change at a time, ranked by expected; tok/s per stream)",
        title_justify="left",
    )
    wt.add_column("change", overflow="fold")
    wt.add_column("expected (80 %)", justify="right")
    wt.add_column("delta", justify="right")
    wt.add_column("bound", justify="right")
    wt.add_column("what moves (ms)", overflow="fold")
    notes: list[str] = []
    for w in p.what_if:
        ref = ""
        if w.note:
            if w.note not in notes:
                notes.append(w.note)
            ref = f" ({notes.index(w.note) + 1})"
        if w.decode_tok_s_per_stream <= 0:
            wt.add_row(esc(w.change + ref), "-", "-", "-", "")
            continue
        style = "green" if w.delta_pct > 0.5 else ("red" if w.delta_pct < -0.5 else "")
        delta = pct(w.delta_pct, signed=True)
        wt.add_row(
            esc(w.change + ref),
            f"{w.decode_tok_s_per_stream:.1f}" + _range(w.tok_s_low, w.tok_s_high, 0),
            f"[{style}]{delta}[/{style}]" if style else delta,
            f"{w.bound_tok_s_per_stream:.1f}",
            esc(w.moved.removesuffix(" ms")),
        )
    out().print(wt)
    if notes:  # a grid: a note wraps under its own text, indented
        grid = Table.grid(padding=(0, 1))
        grid.add_column(justify="right", min_width=5)
        grid.add_column(overflow="fold")
        for i, note in enumerate(notes, 1):
            grid.add_row(f"({i})", esc(note))
        out().print(grid)


def _range(low: float | None, high: float | None, digits: int) -> str:
    """' (low-high)' of an interval ('' when there is none)."""
    return "" if low is None or high is None else f" ({low:.{digits}f}-{high:.{digits}f})"


def _llamacpp_line(lc: LlamaCppDetails) -> None:
    """The GGUF file read and its weight types, by bytes per token."""
    from rich.markup import escape

    types = ", ".join(
        f"{w.type} {w.bytes / 1e9:.3g} GB" for w in sorted(lc.weights, key=lambda w: -w.bytes)
    )
    out().print(
        f"GGUF {escape(Path(lc.gguf).name)} ({escape(lc.arch)}), flash attention "
        f"{'on' if lc.flash_attention else 'off'}: {lc.bytes_per_token / 1e9:.3g} GB read per "
        f"token ({escape(types)}; KV {lc.kv_bytes / 1e9:.3g} GB)"
    )


def _op_table(p: Prediction) -> None:
    """Per-operation table: expected vs bound per op (summed over layers), source, confidence
    (the gap is their difference: left out so that the table fits 80 columns)."""
    from rich.markup import escape
    from rich.table import Table

    bound: dict[str, float] = {}
    for o in p.bound.ops if p.bound else []:
        bound[o.name] = bound.get(o.name, 0.0) + o.ms
    rows: dict[str, list] = {}
    for o in p.expected.ops:  # type: ignore[union-attr]
        r = rows.setdefault(o.name, [0.0, 0.0, o.source, o.confidence, o.kernel, o.note])
        r[0] += o.count
        r[1] += o.ms
    t = Table(
        title="operations per decode step (this GPU, ms; n: calls per step; "
        "source: evidence and its confidence 0-1)",
        title_justify="left",
    )
    for col in ("op", "n", "expected", "bound", "source", "kernel"):
        t.add_column(
            col,
            justify="right" if col in ("n", "expected", "bound") else "left",
            overflow="fold",
        )
    total = p.decode_ms_per_token or 1.0
    for name, (count, ms, src, conf, kernel, _note) in sorted(
        rows.items(), key=lambda kv: -kv[1][1]
    ):
        if ms < 0.002 * total:
            continue
        bms = bound.get(name, 0.0)
        t.add_row(
            escape(name),
            f"{count:g}",
            f"{ms:.3f}",
            f"{bms:.3f}",
            f"{escape(src)} {conf:.1f}",
            escape(kernel),
        )
    out().print(t)
    ev = p.evidence
    if ev.model_dump():  # a CPU's floors have no evidence block
        out().print(
            f"[dim]evidence: tables {escape(str(ev.tables))}; share of expected by source "
            + ", ".join(
                f"{k} {share(v)}" for k, v in (ev.share_of_expected_by_source or {}).items()
            )
            + (
                f"; low confidence: {escape(', '.join(ev.low_confidence_ops))}"
                if ev.low_confidence_ops
                else ""
            )
            + "[/dim]"
        )


def print_catalog(gpus: bool, links: bool, models: bool, as_json: bool) -> None:
    """The shipped catalogs, as tables or one JSON object."""
    from ceiling.spec.hardware import list_gpus, list_links
    from ceiling.spec.model import list_models

    data: dict[str, object] = {}
    if gpus:
        data["gpus"] = [
            {
                "name": g.name,
                "full_name": g.full_name,
                "memory_GiB": g.memory_GiB,
                "mem_bw_GBps": g.mem_bw_GBps,
                "tflops": g.tflops,
                "nvlink": g.nvlink,
                "source": g.source,
            }
            for g in list_gpus()
        ]
    if links:
        data["links"] = [
            {
                "name": lk.name,
                "kind": lk.kind,
                "p2p": lk.p2p,
                "bw_GBps": lk.bw_GBps,
                "description": lk.description,
            }
            for lk in list_links()
        ]
    if models:
        data["models"] = list_models()
    if as_json:
        emit_json(data)
        return
    from rich.markup import escape
    from rich.table import Table

    con = out()
    hidden = {"source", "full_name"}
    for key, rows in data.items():
        t = Table(title=key, title_justify="left")
        cols = [c for c in rows[0] if c not in hidden] if rows else []  # type: ignore[index]
        for c in cols:
            t.add_column(c)
        for r in rows:  # type: ignore[attr-defined]
            t.add_row(*(escape(_cell(r[c])) for c in cols))
        con.print(t)


def _cell(value: object) -> str:
    if isinstance(value, dict):
        return " ".join(f"{k} {v:g}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:g}"
    return "-" if value is None else str(value)
