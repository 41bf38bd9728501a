"""The report section of an engine trace's measured split (``ceiling trace``; doctor's report
when its result carries a trace): the step by op class beside predict's expected and bound,
the top kernels, the unmatched kernels; Markdown tables and an inline SVG stacked bar."""

from __future__ import annotations

import ceiling.report.plots as plots
from ceiling.report.extract import table
from ceiling.trace.measured import measured_split
from ceiling.trace.schema import MeasuredSplit, TraceReport

HEADING = "Measured step (engine trace)"


def heading(rep: TraceReport) -> str:
    """The section's heading (one per recorded window in a doctor report)."""
    return HEADING if not rep.label else f"{HEADING}: {rep.label}"


def doctor_reports(doc: object) -> list[TraceReport]:
    """The windows a doctor run recorded (``doc.traces``), each as a report; the single-stream
    window beside the doctor's prediction (predict's figures are at batch 1, as it runs): the
    verdict's own measured split where the result has one, so the report and the verdict
    state the same rows."""
    out: list[TraceReport] = []
    pred = getattr(doc, "prediction", None)
    verdict = getattr(doc, "verdict", None)
    stated: MeasuredSplit | None = getattr(verdict, "measured", None)
    for t in getattr(doc, "traces", None) or []:
        if not getattr(t, "recorded", False) or getattr(t, "split", None) is None:
            continue
        rep = TraceReport(files=list(t.files), split=t.split, label=t.label)
        if t.label == "single" and pred is not None:
            rep.prediction = "the doctor's prediction (batch 1)"
            rep.predicted_step_ms = pred.decode_ms_per_token
            rep.bound_step_ms = pred.bound.decode_ms_per_token if pred.bound else None
            rep.measured = stated or measured_split(t.split, pred, t.label, list(t.files))
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
    ms = rep.measured
    if ms is not None:
        per_op = any(r.expected_ms is not None for r in ms.rows)
        out += [
            f"Predicted ({rep.prediction}): "
            + (
                f"expected {rep.predicted_step_ms or 0:.3f} ms, bound {rep.bound_step_ms or 0:.3f}"
                " ms per step."
                if per_op
                else "no per-op figures to set beside the classes (a CPU is predicted by its "
                "floors only: each floor bounds the classes of its component)."
            )
            + " The gap over the bound is the configurable part; the bound is the physics.",
            "",
            f"{ms.sentence()} {ms.allreduce_sentence()}",
            "",
            table(
                ["class", "measured ms", "expected ms", "bound ms", "gap over bound ms"],
                [
                    *(
                        [
                            r.op_class,
                            f"{r.measured_ms:.4f}",
                            _ms(r.expected_ms),
                            _ms(r.bound_ms),
                            "–" if r.gap_ms is None else f"{r.gap_ms:+.4f}",
                        ]
                        for r in ms.rows
                    ),
                    *(
                        [
                            [
                                "not in the trace (" + ", ".join(ms.unseen_ops) + ")",
                                "0.0000",
                                f"{ms.unseen_expected_ms:.4f}",
                                f"{ms.unseen_bound_ms:.4f}",
                                "–",
                            ]
                        ]
                        if ms.unseen_ops
                        else []
                    ),
                ],
            ),
            "",
        ]
    rows = [
        [
            c.op_class,
            f"{c.ms:.4f}",
            f"{c.share * 100:.1f} %",
            f"{c.calls:g}",
            ", ".join(c.impl),
            "–" if c.wait_ms is None else f"{c.transfer_ms:.4f} / {c.wait_ms:.4f}",
        ]
        for c in sp.classes
    ]
    rows.append(
        [
            "idle (host/launch)",
            f"{sp.idle_ms:.4f}",
            f"{sp.idle_ms / sp.step_ms * 100 if sp.step_ms else 0:.1f} %",
            "",
            "",
            "",
        ]
    )
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
            table(
                ["kernel", "ms/step", "calls/step"],
                [[u.name[:120], f"{u.ms:.4f}", f"{u.count:g}"] for u in sp.unmatched[:40]],
            ),
            "",
        ]
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
    ms = rep.measured
    if ms is not None:
        bars = [("measured", [(r.op_class, r.measured_ms) for r in ms.rows])]
        for label, attr, unseen in (
            ("expected", "expected_ms", ms.unseen_expected_ms),
            ("bound", "bound_ms", ms.unseen_bound_ms),
        ):
            vals = [(r.op_class, getattr(r, attr)) for r in ms.rows]
            if all(v is None for _, v in vals):
                continue  # no figure of this kind (a CPU's floors give no expected per class)
            segs = [(n, v or 0.0) for n, v in vals]
            bars.append((label, segs + ([("not in the trace", unseen)] if unseen else [])))
    return plots.stacked_step(bars)


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.4f}"


def render_trace_markdown(rep: TraceReport) -> str:
    return "\n".join(["# ceiling trace", "", *trace_lines(rep)]).rstrip() + "\n"
