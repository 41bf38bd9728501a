"""Self-contained HTML report: the Markdown report's content plus inline SVG plots.

The HTML is produced from the same Markdown text by ``markdown-it-py`` (CommonMark plus GFM
tables), so the two formats can never disagree; plots are inserted under the section they
illustrate. Raw HTML in the Markdown is escaped, not passed through (titles and log lines come
from the user's files). No external resources, no JavaScript: the file opens offline, in any
browser, and can be attached to a ticket as is.
"""

from __future__ import annotations

import re
from functools import cache
from html import escape

from markdown_it import MarkdownIt
from markdown_it.token import Token

import ceiling.report.plots as plots
import ceiling.report.trace as trace_report
from ceiling.diagnose.schema import DoctorResult
from ceiling.report.extract import (
    itl_samples_ms,
    levels,
    num,
    telemetry_points,
    ttft_samples_ms,
)
from ceiling.report.markdown import Doc, render_markdown
from ceiling.sweep.schema import SweepResult
from ceiling.trace.schema import TraceReport

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:980px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;border-bottom:2px solid #0072B2;padding-bottom:.2em}
h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f3f6fa}
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.9em}
pre{background:#f6f8fa;padding:.7em;overflow-x:auto}
blockquote{border-left:4px solid #D55E00;margin:1em 0;padding:.3em 1em;background:#fff4ee}
svg.plot{display:block;margin:.8em 0;max-width:100%;height:auto}
ul ul{list-style:circle}
.verdict strong{font-size:1.08em}
"""


@cache
def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark", {"html": False}).enable("table")


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _is_verdict(inline: Token) -> bool:
    """A paragraph that is bold from end to end (the verdict's headline)."""
    kids = [k for k in inline.children or [] if k.type != "text" or k.content.strip()]
    return len(kids) >= 2 and kids[0].type == "strong_open" and kids[-1].type == "strong_close"


def markdown_to_html(md: str, after_heading: dict[str, list[str]] | None = None) -> str:
    """Markdown -> HTML; ``after_heading`` inserts raw HTML at the end of an h2's section."""
    after_heading = after_heading or {}
    parser = _parser()
    env: dict[str, object] = {}
    tokens = parser.parse(md, env)
    out: list[Token] = []
    pending: list[Token] = []
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open" and tok.tag == "h2":
            out.extend(pending)
            title = tokens[i + 1].content.strip()
            tok.attrSet("id", _slug(title))
            pending = [
                Token("html_block", "", 0, content=html + "\n", block=True)
                for html in after_heading.get(title, [])
            ]
        elif tok.type == "paragraph_open" and _is_verdict(tokens[i + 1]):
            tok.attrSet("class", "verdict")
        out.append(tok)
    out.extend(pending)
    return parser.renderer.render(out, parser.options, env)


def build_plots(doc: Doc) -> dict[str, list[str]]:
    """SVG plots keyed by the Markdown section heading they belong under."""
    if isinstance(doc, SweepResult):
        items = [(c.label, c.tok_s, c.low, c.high) for c in doc.comparison if c.tok_s is not None]
        return {
            "Variant comparison": [
                plots.bars_ci(items, "Decode tok/s per stream, 95 % CI", "tok/s per stream")
            ]
        }
    return _doctor_plots(doc)


def _doctor_plots(doc: DoctorResult) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    a = doc.attribution
    if a is not None:
        comps = [(c.name, c.predicted_ms, c.kind) for c in a.components]
        out["Where the step time goes"] = [plots.waterfall(comps, a.measured_step_ms)]
    pts = levels(doc.bench.get("concurrency"))
    if pts:
        series = {
            "output tok/s, end to end": [
                (float(p.concurrency or 0), v) for p in pts if (v := num(p.output_throughput))
            ]
        }
        if doc.levels:  # from the decode step (the engine's own when the client saw bursts)
            series["decode tok/s, all streams"] = [
                (float(lv.concurrency), lv.decode_tok_s_total) for lv in doc.levels
            ]
            series["decode tok/s per stream"] = [
                (float(lv.concurrency), lv.decode_tok_s_total / lv.concurrency) for lv in doc.levels
            ]
        else:
            series["decode tok/s per stream (client)"] = [
                (float(p.concurrency or 0), v) for p in pts if (v := num(p.decode_tok_s_per_stream))
            ]
        out["Throughput vs concurrency"] = [
            plots.lines(
                {k: v for k, v in series.items() if v},
                "Throughput vs concurrency",
                "concurrent streams",
                "tok/s",
            )
        ]
    runs = (doc.bench.get("single"), doc.bench.get("concurrency"))
    ttft, itl = ttft_samples_ms(*runs), itl_samples_ms(*runs)
    if ttft or itl:
        out["Latency distributions (ms)"] = [
            plots.histogram(ttft, "Time to first token"),
            plots.histogram(itl, "Inter-token latency"),
        ]
    tel_svgs = []
    for key, label, unit in (
        ("sm_util_pct", "SM utilisation", "%"),
        ("pcie_tx_GBps", "PCIe transmit", "GB/s"),
        ("pcie_rx_GBps", "PCIe receive", "GB/s"),
    ):
        per_gpu = telemetry_points(doc.telemetry, key)
        if per_gpu:
            tel_svgs.append(
                plots.lines(
                    per_gpu, f"Telemetry: {label} during the single-stream run", "time (s)", unit
                )
            )
    if not tel_svgs:
        reason = (doc.telemetry.reason if doc.telemetry else None) or "telemetry not recorded"
        tel_svgs = [plots.empty_plot("Telemetry", f"no telemetry: {reason}")]
    out.setdefault("Deployment", []).extend(tel_svgs)
    for rep in trace_report.doctor_reports(doc):  # doctor --trace: each recorded window
        out[trace_report.heading(rep)] = [trace_report.trace_plot(rep)]
    return out


def render_html(doc: Doc) -> str:
    """One self-contained HTML page for a doctor or sweep result document."""
    return page(doc.title or "ceiling report", render_markdown(doc), build_plots(doc))


def page(title_text: str, md: str, plots_by_heading: dict[str, list[str]]) -> str:
    """One self-contained HTML page of ``md`` with plots under their section headings."""
    body = markdown_to_html(md, plots_by_heading)
    title = escape(title_text)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="data:,"><title>{title}</title><style>{_CSS}</style></head>\n<body>\n{body}\n</body></html>\n'
    )


def render_trace_html(rep: TraceReport) -> str:
    """``ceiling trace --report X.html``: the trace section as one page, with its plot."""
    return page(
        "ceiling trace",
        trace_report.render_trace_markdown(rep),
        {trace_report.heading(rep): [trace_report.trace_plot(rep)]},
    )
