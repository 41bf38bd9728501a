"""What ``ceiling trace FILE...`` prints: the measured step, a bar of it by op class (beside
predict's expected and bound when asked for), the classes, top kernels, unmatched kernels,
overlap, ranks and notes."""

from __future__ import annotations

from ceiling.fmt import share
from ceiling.render import emit_json, esc, out, table
from ceiling.trace.capture import TraceCapture
from ceiling.trace.schema import TraceReport, TraceSplit

_BAR = 60
_GLYPHS = "█▓▒░#=+*%@&o"


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v:.3f}"


def report(rep: TraceReport, json_out: bool = False) -> None:
    if json_out:
        emit_json(rep)
        return
    o = out()
    sp = rep.split
    o.print(f"[bold]{esc(sp.headline)}[/bold]")
    o.print(
        f"steps from {esc(sp.step_source)}; skipped: "
        + (", ".join(f"{v} {esc(k)}" for k, v in sp.steps_skipped.items()) or "none"),
    )
    o.print(esc(stacked_bar(sp, min(_BAR, o.width - 2))))
    ms = rep.measured
    if ms is not None:
        o.print(
            f"predicted ({esc(rep.prediction)}): expected {rep.predicted_step_ms or 0:.3f} ms, "
            f"bound {rep.bound_step_ms or 0:.3f} ms per step",
        )
        o.print(esc(f"{ms.sentence()} {ms.allreduce_sentence()}"))
        rows = [
            [
                esc(r.op_class),
                f"{r.measured_ms:.3f}",
                _ms(r.expected_ms),
                _ms(r.bound_ms),
                "" if r.gap_ms is None else f"{r.gap_ms:+.3f}",
            ]
            for r in ms.rows
        ]
        if ms.unseen_ops:
            rows.append(
                [
                    esc("not in the trace: " + ", ".join(ms.unseen_ops)),
                    "0.000",
                    f"{ms.unseen_expected_ms:.3f}",
                    f"{ms.unseen_bound_ms:.3f}",
                    "",
                ]
            )
        o.print(
            table(
                "measured vs predict (ms per step)",
                ["class", "measured", "expected", "bound", "gap over bound"],
                rows,
            )
        )
    rows = [
        [
            esc(c.op_class),
            f"{c.ms:.4f}",
            share(c.share),
            f"{c.calls:g}",
            esc(", ".join(c.impl)),
            "" if c.wait_ms is None else f"{c.transfer_ms:.4f} / {c.wait_ms:.4f}",
        ]
        for c in sp.classes
    ]
    rows.append(
        [
            "idle (host/launch)",
            f"{sp.idle_ms:.4f}",
            share(sp.idle_ms / sp.step_ms if sp.step_ms else 0.0),
            "",
            "",
            "",
        ]
    )
    o.print(
        table(
            "by op class (ms per step)",
            ["class", "ms", "share", "calls", "impl", "transfer / wait"],
            rows,
        )
    )
    rows = [
        [esc(k.name[:110]), esc(k.op_class), f"{k.ms:.4f}", f"{k.calls:g}", f"{k.mean_us:.1f}"]
        for k in sp.top_kernels
    ]
    o.print(table("top kernels", ["kernel", "class", "ms/step", "calls/step", "us/call"], rows))
    if sp.unmatched:
        rows = [[esc(u.name[:110]), f"{u.ms:.4f}", f"{u.count:g}"] for u in sp.unmatched[:30]]
        o.print(
            table(
                f"unmatched kernels ({len(sp.unmatched)})",
                ["kernel", "ms/step", "calls/step"],
                rows,
            )
        )
    for ov in sp.overlap:
        o.print(
            f"overlap: stream {ov.stream} ran {ov.own_ms:.4f} ms/step of {esc(ov.op_class)} "
            f"({esc(', '.join(k[:50] for k in ov.top_kernels))}); {ov.hidden_ms:.4f} ms of it "
            "under the main stream, counted once",
        )
    if len(sp.ranks) > 1:
        rows = [
            [
                str(r.rank),
                f"{r.step_ms:.4f}",
                f"{r.idle_ms:.4f}",
                str(r.steps),
                "" if r.collective_wait_ms is None else f"{r.collective_wait_ms:.4f}",
            ]
            for r in sp.ranks
        ]
        o.print(table("ranks", ["rank", "step ms", "idle ms", "steps", "collective wait ms"], rows))
    for n in sp.notes:
        o.print(f"[dim]note: {esc(n)}[/dim]")
    for label, path in (
        ("result", rep.out),
        ("report", rep.report),
        ("profile (predict --profile)", rep.profile_out),
    ):
        if path:
            o.print(f"wrote {label}: {esc(path)}")


def stacked_bar(sp: TraceSplit, width: int = _BAR) -> str:
    """The step as one text bar, a glyph per class (idle as blanks), its legend on the next
    line (it wraps; the bar does not)."""
    if sp.step_ms <= 0:
        return ""
    parts = [(c.op_class, c.ms) for c in sp.classes] + [("idle", sp.idle_ms)]
    bar, legend = "", []
    for i, (name, ms) in enumerate(parts):
        n = round(ms / sp.step_ms * width)
        g = " " if name == "idle" else _GLYPHS[i % len(_GLYPHS)]
        bar += g * n
        if ms / sp.step_ms >= 0.005:
            legend.append(f"{'·' if g == ' ' else g} {name} {ms:.3f}")
    return f"|{bar[:width]:<{width}}|\n" + "  ".join(legend)


def capture(res: TraceCapture, json_out: bool = False) -> None:
    """``ceiling trace capture``: the window recorded (or why not), its split, the stream."""
    if json_out:
        emit_json(res)
        return
    o = out()
    if not res.recorded or res.split is None:
        o.print(f"[bold]no trace recorded[/bold]: {esc(res.why_not or '')}")
        return
    sp = res.split
    o.print(f"[bold]{esc(sp.headline)}[/bold]")
    o.print(esc(stacked_bar(sp, min(_BAR, o.width - 2))))
    if res.engine_itl_ms is not None:
        o.print(
            f"the engine's own inter-token latency in the window: {res.engine_itl_ms:.3f} ms "
            f"({res.engine_itl_count} observations); trace step {res.step_vs_engine_pct:+.2f} %",
        )
    if res.stream_itl_ms is not None:
        o.print(
            f"the stream's inter-token latency over the same steps: {res.stream_itl_ms:.3f} ms "
            f"({res.stream_gaps} gaps); trace step {res.step_vs_stream_pct:+.2f} %",
        )
    for path in res.files:
        o.print(f"trace: {esc(path)}")
    for n in [*sp.notes, *res.notes]:
        o.print(f"[dim]note: {esc(n)}[/dim]")
