"""The report section of an engine trace's measured split (``ceiling trace``; doctor's report
when its result carries a trace): the step by op class beside predict's expected and bound,
the top kernels, the unmatched kernels; Markdown tables and an inline SVG stacked bar."""

from __future__ import annotations

import ceiling.report.plots as plots
from ceiling.report.extract import table
from ceiling.trace.compare import compare
from ceiling.trace.schema import TraceReport

HEADING = "Measured step (engine trace)"


def heading(rep: TraceReport) -> str:
    """The section's heading (one per recorded window in a doctor report)."""
    return HEADING if not rep.label else f"{HEADING}: {rep.label}"


def doctor_reports(doc: object) -> list[TraceReport]:
    """The windows a doctor run recorded (``doc.traces``), each as a report; the single-stream
    window beside the doctor's prediction (predict's figures are at batch 1, as it runs)."""
    out: list[TraceReport] = []
    pred = getattr(doc, "prediction", None)
    for t in getattr(doc, "traces", None) or []:
        if not getattr(t, "recorded", False) or getattr(t, "split", None) is None:
            continue
        rep = TraceReport(files=list(t.files), split=t.split, label=t.label)
        if t.label == "single" and pred is not None:
            rep.prediction = "the doctor's prediction (batch 1)"
            rep.predicted_step_ms = pred.decode_ms_per_token
            rep.bound_step_ms = pred.bound.decode_ms_per_token if pred.bound else None
            rep.compare = compare(t.split, pred)
        out.append(rep)
    return out


def trace_lines(rep: TraceReport) -> list[str]:
    """The section's Markdown."""
    sp = rep.split
    out = [f"## {heading(rep)}", "", f"**{sp.headline}**", ""]
    out.append(
        f"Steps from {sp.step_source}; {sp.steps} counted"
        + (
            "; skipped: " + ", ".join(f"{v} {k}" for k, v in sp.steps_skipped.items())
            if sp.steps_skipped
            else ""
        )
        + f". Files: {', '.join(rep.files)}."
    )
    out.append("")
    if rep.prediction and not rep.compare:
        out += [f"Predicted ({rep.prediction}): no per-op figures to set beside the classes "
                "(a CPU is predicted by its floors only).", ""]  # fmt: skip
    if rep.compare:
        out += [
            f"Predicted ({rep.prediction}): expected {rep.predicted_step_ms:.3f} ms, "
            f"bound {rep.bound_step_ms or 0:.3f} ms per step. The gap over the bound is the "
            "configurable part; the bound is the physics.",
            "",
            table(
                ["class", "measured ms", "expected ms", "bound ms", "gap over bound ms"],
                [
                    [
                        c.bucket,
                        f"{c.measured_ms:.4f}",
                        f"{c.expected_ms:.4f}",
                        f"{c.bound_ms:.4f}",
                        "–" if c.gap_ms is None else f"{c.gap_ms:+.4f}",
                    ]
                    for c in rep.compare
                ],
            ),
            "",
        ]
    rows = [
        [c.op_class, f"{c.ms:.4f}", f"{c.share * 100:.1f} %", f"{c.calls:g}", ", ".join(c.impl),
         "–" if c.wait_ms is None else f"{c.transfer_ms:.4f} / {c.wait_ms:.4f}"]
        for c in sp.classes
    ]  # fmt: skip
    rows.append(["idle (host/launch)", f"{sp.idle_ms:.4f}",
                 f"{sp.idle_ms / sp.step_ms * 100 if sp.step_ms else 0:.1f} %", "", "", ""])  # fmt: skip
    out += [
        table(
            ["class", "ms/step", "share", "calls/step", "implementation", "transfer / wait ms"],
            rows,
        ),
        "",
        "Top kernels:",
        "",
        table(
            ["kernel", "class", "ms/step", "calls/step", "us/call"],
            [
                [k.name[:120], k.op_class, f"{k.ms:.4f}", f"{k.calls:g}", f"{k.mean_us:.1f}"]
                for k in sp.top_kernels
            ],
        ),
        "",
    ]
    if sp.unmatched:
        out += [
            f"Unmatched kernels ({len(sp.unmatched)}, {(1 - sp.coverage) * 100:.1f} % of kernel "
            "time): no pattern of the engine's table or the generic one names them.",
            "",
            table(["kernel", "ms/step", "calls/step"],
                  [[u.name[:120], f"{u.ms:.4f}", f"{u.count:g}"] for u in sp.unmatched[:40]]),
            "",
        ]  # fmt: skip
    for ov in sp.overlap:
        out.append(
            f"- overlap: stream {ov.stream} ran {ov.own_ms:.4f} ms/step of {ov.op_class} "
            f"({', '.join(k[:60] for k in ov.top_kernels)}), {ov.hidden_ms:.4f} ms of it under "
            "the main stream (counted once)"
        )
    if len(sp.ranks) > 1:
        out += [
            "",
            table(
                ["rank", "step ms", "idle ms", "steps", "collective wait ms"],
                [
                    [
                        str(r.rank),
                        f"{r.step_ms:.4f}",
                        f"{r.idle_ms:.4f}",
                        str(r.steps),
                        "–" if r.collective_wait_ms is None else f"{r.collective_wait_ms:.4f}",
                    ]
                    for r in sp.ranks
                ],
            ),
        ]
    out += [f"- note: {n}" for n in sp.notes]
    out.append("")
    return out


def trace_plot(rep: TraceReport) -> str:
    """The stacked bar: measured by class (+ idle), and predict's expected and bound."""
    sp = rep.split
    measured = [(c.op_class, c.ms) for c in sp.classes] + [("idle", sp.idle_ms)]
    bars: list[tuple[str, list[tuple[str, float]]]] = [("measured", measured)]
    if rep.compare:
        for label, attr in (("expected", "expected_ms"), ("bound", "bound_ms")):
            bars.append(
                (label, [(c.bucket if c.bucket != "idle" else "idle", getattr(c, attr))
                         for c in rep.compare])
            )  # fmt: skip
        bars[0] = ("measured", [(c.bucket, c.measured_ms) for c in rep.compare])
    return plots.stacked_step(bars)


def render_trace_markdown(rep: TraceReport) -> str:
    return "\n".join(["# ceiling trace", "", *trace_lines(rep)]).rstrip() + "\n"
