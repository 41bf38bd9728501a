"""Self-contained HTML report: the Markdown report's content plus inline SVG plots.

The HTML is produced from the same Markdown text (a small converter for exactly the subset our
Markdown writer emits), so the two formats can never disagree; plots are inserted under the
section they illustrate. No external resources, no JavaScript: the file opens offline, in any
browser, and can be attached to a ticket as is.
"""

from __future__ import annotations

import re
from html import escape

from ceiling.report import plots
from ceiling.report.extract import (
    Doc,
    concurrency_points,
    itl_samples_ms,
    num,
    telemetry_points,
    ttft_samples_ms,
)
from ceiling.report.markdown import render_markdown

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
.verdict strong{font-size:1.08em}
"""


def _inline(text: str) -> str:
    s = escape(text, quote=False)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    s = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", s)
    s = re.sub(r"(?<![\w*])_([^_]+)_(?![\w*])", r"<em>\1</em>", s)
    return s


def _split_row(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [c.strip().replace("\\|", "|") for c in cells]


def markdown_to_html(md: str, after_heading: dict[str, list[str]] | None = None) -> str:
    """Convert our Markdown subset; ``after_heading`` inserts raw HTML after an h2's content."""
    after_heading = after_heading or {}
    out: list[str] = []
    lines = md.splitlines()
    i = 0
    pending: list[str] = []

    def flush() -> None:
        out.extend(pending)
        pending.clear()

    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append("<pre><code>" + escape("\n".join(lines[i + 1 : j])) + "</code></pre>")
            i = j + 1
            continue
        if line.startswith("# "):
            out.append(f"<h1>{_inline(line[2:])}</h1>")
        elif line.startswith("## "):
            flush()
            title = line[3:].strip()
            sec_id = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
            out.append(f'<h2 id="{sec_id}">{_inline(title)}</h2>')
            pending.extend(after_heading.get(title, []))
        elif line.startswith("| "):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(lines[i])
                i += 1
            head = _split_row(rows[0])
            body = [_split_row(r) for r in rows[2:]]
            out.append(
                "<table><thead><tr>"
                + "".join(f"<th>{_inline(h)}</th>" for h in head)
                + "</tr></thead><tbody>"
            )
            for r in body:
                out.append("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>")
            out.append("</tbody></table>")
            continue
        elif line.startswith("- ") or line.startswith("  - "):
            out.append("<ul>")
            while i < len(lines) and (lines[i].startswith("- ") or lines[i].startswith("  - ")):
                item = lines[i]
                nested = item.startswith("  - ")
                text = item[4:] if nested else item[2:]
                style = ' style="margin-left:1.5em;list-style:circle"' if nested else ""
                out.append(f"<li{style}>{_inline(text)}</li>")
                i += 1
            out.append("</ul>")
            continue
        elif line.startswith("> "):
            out.append(f"<blockquote>{_inline(line[2:])}</blockquote>")
        elif line.strip().startswith("**") and line.strip().endswith("**"):
            out.append(f'<p class="verdict">{_inline(line)}</p>')
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    flush()
    return "\n".join(out)


def build_plots(doc: Doc) -> dict[str, list[str]]:
    """SVG plots keyed by the Markdown section heading they belong under."""
    out: dict[str, list[str]] = {}
    a = doc.get("attribution")
    if a:
        comps = [
            (c["name"], num(c.get("predicted_ms")) or 0.0, c.get("kind", "fundamental"))
            for c in a.get("components", [])
        ]
        out["Where the step time goes"] = [plots.waterfall(comps, num(a.get("measured_step_ms")))]
    bench = doc.get("bench") or {}
    pts = concurrency_points(bench.get("concurrency"))
    if pts:
        series = {
            "output tok/s, end to end": [
                (p["concurrency"], v) for p in pts if (v := num(p.get("output_throughput")))
            ]
        }
        levels = doc.get("levels") or []
        if levels:  # from the decode step (the engine's own when the client saw bursts)
            series["decode tok/s, all streams"] = [
                (float(lv["concurrency"]), v)
                for lv in levels
                if (v := num(lv.get("decode_tok_s_total")))
            ]
            series["decode tok/s per stream"] = [
                (float(lv["concurrency"]), v / lv["concurrency"])
                for lv in levels
                if (v := num(lv.get("decode_tok_s_total")))
            ]
        else:
            series["decode tok/s per stream (client)"] = [
                (p["concurrency"], v) for p in pts if (v := num(p.get("decode_tok_s_per_stream")))
            ]
        out["Throughput vs concurrency"] = [
            plots.lines(
                {k: v for k, v in series.items() if v},
                "Throughput vs concurrency",
                "concurrent streams",
                "tok/s",
            )
        ]
    runs = (bench.get("single"), bench.get("concurrency"))
    ttft, itl = ttft_samples_ms(*runs), itl_samples_ms(*runs)
    if ttft or itl:
        out["Latency distributions (ms)"] = [
            plots.histogram(ttft, "Time to first token"),
            plots.histogram(itl, "Inter-token latency"),
        ]
    comp = doc.get("comparison") or []
    if comp:
        items = [
            (c.get("label", "?"), num(c.get("tok_s")) or 0.0, num(c.get("low")), num(c.get("high")))
            for c in comp
            if num(c.get("tok_s")) is not None
        ]
        out["Variant comparison"] = [
            plots.bars_ci(items, "Decode tok/s per stream, 95 % CI", "tok/s per stream")
        ]
    tel = doc.get("telemetry")
    tel_svgs = []
    for key, label, unit in (
        ("sm_util_pct", "SM utilisation", "%"),
        ("pcie_tx_GBps", "PCIe transmit", "GB/s"),
        ("pcie_rx_GBps", "PCIe receive", "GB/s"),
    ):
        pts = telemetry_points(tel, key)
        if pts:
            tel_svgs.append(
                plots.lines(
                    pts, f"Telemetry: {label} during the single-stream run", "time (s)", unit
                )
            )
    if not tel_svgs:
        reason = (tel or {}).get("reason") or "telemetry not recorded"
        tel_svgs = [plots.empty_plot("Telemetry", f"no telemetry: {reason}")]
    out.setdefault("Deployment", []).extend(tel_svgs)
    return out


def render_html(doc: Doc) -> str:
    """One self-contained HTML page for a doctor or sweep result document."""
    md = render_markdown(doc)
    body = markdown_to_html(md, build_plots(doc))
    title = escape(doc.get("title") or "ceiling report")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="data:,"><title>{title}</title><style>{_CSS}</style></head>\n<body>\n{body}\n</body></html>\n'
    )
