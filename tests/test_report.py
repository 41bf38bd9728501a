"""Reports render from saved result files: verdict first, every section, valid inline SVG."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ceiling.cli import main
from ceiling.diagnose.schema import DoctorResult, Telemetry
from ceiling.errors import CeilingError
from ceiling.report import load_doc, plots, render, render_file
from ceiling.report.html import markdown_to_html, render_html
from ceiling.report.markdown import render_markdown
from ceiling.sweep.schema import ComparisonRow, SweepResult, SweepVerdict

DATA = Path(__file__).parent / "data" / "report"
SVG_NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def doc() -> DoctorResult:
    d = load_doc(DATA / "doctor-cpu.json")
    assert isinstance(d, DoctorResult)
    return d


def test_the_fixture_is_what_the_models_write():
    """doctor-cpu.json reads back into ``DoctorResult`` strictly and is exactly what the model
    writes: a field added, renamed or dropped fails here (regenerate the fixture with
    tests/data/report/make_doctor_cpu.py)."""
    raw = json.loads((DATA / "doctor-cpu.json").read_text())
    doc = DoctorResult.model_validate(raw)
    assert json.loads(doc.model_dump_json()) == raw
    assert doc.verdict is not None and doc.attribution is not None and doc.prediction is not None


def test_a_field_the_models_do_not_know_is_refused(tmp_path):
    raw = json.loads((DATA / "doctor-cpu.json").read_text())
    raw["verdict"]["pct_of_ceiling"] = 12.0  # e.g. a file from an older or newer ceiling
    bad = tmp_path / "doctor.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(CeilingError, match=r"verdict\.pct_of_ceiling"):
        load_doc(bad)
    raw = json.loads((DATA / "doctor-cpu.json").read_text())
    del raw["attribution"]["measured_step_ms"]
    bad.write_text(json.dumps(raw))
    with pytest.raises(CeilingError, match=r"attribution\.measured_step_ms"):
        render_file(bad)


def test_markdown_verdict_first_and_numbers_from_the_file(doc):
    md = render_markdown(doc)
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Verdict"
    assert doc.verdict is not None and doc.attribution is not None
    assert md.index(doc.verdict.headline) < md.index("## Where the step time goes")
    assert f"{doc.attribution.measured_step_ms:.4f}" in md
    assert "kernel inefficiency / host overhead" in md
    for title in (
        "Throughput vs concurrency",
        "Latency distributions (ms)",
        "Reproduce",
        "What ran",
        "The usual hypotheses",
    ):
        assert f"## {title}" in md
    assert doc.reproduce[0] in md


def test_html_is_self_contained_and_plots_parse(doc):
    html = render_html(doc)
    assert "<script" not in html
    for bad in ("http://", "https://"):
        # the only URLs allowed are the SVG namespace and the reproduced server URL
        rest = html.replace("http://www.w3.org/2000/svg", "").replace(doc.target.url or "", "")
        assert bad not in rest
    svgs = [s.split("</svg>")[0] + "</svg>" for s in html.split("<svg")[1:]]
    assert len(svgs) >= 5  # waterfall, concurrency, TTFT, ITL, telemetry (empty state)
    kinds = []
    for s in svgs:
        root = ET.fromstring("<svg" + s)
        kinds.append(root.get("class"))
        assert root.find(f"{SVG_NS}title") is not None
    assert "plot plot-waterfall" in kinds and "plot plot-histogram" in kinds
    assert "plot plot-lines" in kinds


def _bars(svg: str, kind: str = "bar") -> list[tuple[str, float]]:
    """(id, drawn width) of each bar: matplotlib draws a bar as a <g id=...><path d=...>."""
    root = ET.fromstring(svg)
    out = []
    for g in root.iter(f"{SVG_NS}g"):
        if f"-{kind}-" in (g.get("id") or ""):
            xs = [
                float(x) for x in re.findall(r"([-\d.]+) [-\d.]+", g.find(f"{SVG_NS}path").get("d"))
            ]
            out.append((g.get("id"), max(xs) - min(xs)))
    return out


def test_waterfall_bars_add_up(doc):
    comps = [("weights", 1.0, "fundamental"), ("launch", 0.5, "configurable")]
    rows = plots.waterfall_rows(comps, 4.0)
    assert [(label, start, end) for label, start, end, _ in rows] == [
        ("weights", 0.0, 1.0),
        ("launch", 1.0, 1.5),  # floats on the previous component
        ("predicted total", 0.0, 1.5),
        ("kernel inefficiency / host overhead", 1.5, 4.0),
        ("measured step", 0.0, 4.0),
    ]
    assert plots.waterfall_rows(comps, 1.0)[3][:3] == ("measured below predicted", 1.0, 1.5)
    svg = plots.waterfall(comps, 4.0)
    bars = _bars(svg)
    # weights, launch, predicted total, unexplained, measured: drawn to one scale
    assert [i.split("-bar-")[1] for i, _ in bars] == [
        "fundamental-0",
        "configurable-1",
        "total-2",
        "unexplained-3",
        "total-4",
    ]
    widths = [w for _, w in bars]
    assert widths[0] + widths[1] == pytest.approx(widths[2], rel=1e-3)
    assert widths[2] + widths[3] == pytest.approx(widths[4], rel=1e-3)
    assert widths[4] == pytest.approx(4 * widths[0], rel=1e-3)
    assert "kernel inefficiency / host overhead" in svg and "2.50 ms" in svg


def test_plots_handle_missing_and_degenerate_data():
    assert "no samples" in plots.histogram([], "TTFT")
    assert "no data points" in plots.lines({}, "t", "x", "y")
    assert "no variants" in plots.bars_ci([], "t", "u")
    one = plots.histogram([5.0, 5.0, 5.0], "same")
    assert len(_bars(one, "bin")) == 30 and "p50 5" in one
    bars = plots.bars_ci([("a", 10.0, 9.0, 11.0), ("b<&>", 12.0, None, None)], "t", "u")
    assert "b&lt;&amp;&gt;" in bars and len(_bars(bars)) == 2
    assert "-ci-0" in bars and "-ci-1" not in bars  # a whisker only where there is a CI
    label = 'plan $5 or $6, id="a" url(#b)'  # not TeX; no id rewriting inside text
    dollars = plots.lines({label: [(1, 2.0)]}, "t", "x", "y")
    assert label in "".join(ET.fromstring(dollars).itertext())
    # ids stay unique across the plots of one page (matplotlib numbers ids from 1 in each)
    page = plots.histogram([1.0, 2.0], "a") + plots.histogram([1.0, 2.0], "b")
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert ids and len(ids) == len(set(ids))


def test_render_file_rewrites_reports_beside_the_saved_json(doc, tmp_path):
    src = tmp_path / "doctor.json"
    shutil.copy(DATA / "doctor-cpu.json", src)
    paths = render_file(src)
    assert Path(paths["md"]).read_text().startswith("# ceiling doctor")
    assert Path(paths["html"]).read_text().startswith("<!DOCTYPE html>")
    # the CLI does the same and prints the paths as JSON
    out = tmp_path / "other"
    assert main(["report", str(src), "--out-dir", str(out), "--json"]) == 0
    assert (out / "report.html").is_file()


def test_server_death_is_stated(doc):
    doc.server_died = True
    doc.server_death = "during bench concurrency: exit code -9: killed"
    md = render_markdown(doc)
    assert "The server died during the doctor run" in md
    assert "exit code -9" in md


def test_sweep_report_compares_variants(tmp_path):
    doc = SweepResult(
        title="ceiling sweep — t",
        plan=None,
        ledger="ledger.jsonl",
        baseline="base",
        variants=[],
        verdict=SweepVerdict(headline="No variant significantly beats the baseline base."),
        comparison=[
            ComparisonRow(
                label="base",
                tok_s=100.0,
                low=99.0,
                high=101.0,
                verdict="baseline",
                status="done",
                repeats=5,
            ),
            ComparisonRow(
                label="ll",
                tok_s=100.4,
                low=99.5,
                high=101.3,
                delta_pct=0.4,
                verdict="no significant difference",
                status="stopped_early",
                repeats=3,
            ),
        ],
    )
    paths = render(doc, tmp_path)
    md = Path(paths["md"]).read_text()
    assert "| ll | 100 (95 % CI 99.50–101)" in md or "| ll |" in md
    assert "no significant difference" in md
    assert "plot-bars" in Path(paths["html"]).read_text()


def test_load_doc_errors(tmp_path):
    with pytest.raises(CeilingError, match="not found"):
        load_doc(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(CeilingError, match="schema_version"):
        load_doc(bad)


@pytest.mark.browser
def test_html_report_in_headless_chromium(doc, tmp_path):
    """The page loads in a real browser, every plot renders with a size, no console errors."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium not installed (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    paths = render(doc, tmp_path)
    shot = tmp_path / "report.png"
    messages: list[tuple[str, str]] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            page = browser.new_page()
            page.on("console", lambda m: messages.append((m.type, m.text)))
            page.on("pageerror", lambda e: messages.append(("pageerror", str(e))))
            page.on("requestfailed", lambda r: messages.append(("requestfailed", r.url)))
            page.goto(Path(paths["html"]).as_uri())
            assert page.title().startswith("ceiling doctor")
            plots_ = page.locator("svg.plot")
            assert plots_.count() >= 5
            for i in range(plots_.count()):
                box = plots_.nth(i).bounding_box()
                assert box is not None and box["width"] > 100 and box["height"] > 50
            bars = page.locator("svg.plot-waterfall g[id*='-bar-']")
            assert bars.count() >= 4
            assert page.locator("h2").first.inner_text() == "Verdict"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    errors = [m for m in messages if m[0] in ("error", "pageerror", "requestfailed")]
    assert errors == []
    assert shot.stat().st_size > 10_000


def test_telemetry_timeline_from_samples(doc):
    samples = [
        {
            "t": 1000.0 + 0.05 * i,
            "gpu": g,
            "sm_util_pct": 40.0 + g + (i % 5),
            "pcie_tx_GBps": 0.8,
            "pcie_rx_GBps": 0.7,
        }
        for i in range(40)
        for g in (0, 1)
    ]
    doc.telemetry = Telemetry.model_validate(
        {
            "available": True,
            "interval_s": 0.05,
            "samples": samples,
            "summary": {"verdict": "PCIe under 2 % of the link"},
        }
    )
    html = render_html(doc)
    assert "Telemetry: SM utilisation" in html and "Telemetry: PCIe transmit" in html
    assert "gpu0" in html and "gpu1" in html
    assert "PCIe under 2 % of the link" in render_markdown(doc)
    doc.telemetry = Telemetry(available=False, reason="NVML not found", interval_s=0.05)
    assert "no telemetry: NVML not found" in render_html(doc)


def test_server_view_table(doc):
    doc.bench["single"].server_metrics = {
        "available": True,
        "quantities": {
            "itl": {
                "metric": "vllm:inter_token_latency_seconds",
                "server_mean_ms": 5.308,
                "client_mean_ms": 4.89,
                "overhead_ms": -0.418,
            }
        },
    }
    md = render_markdown(doc)
    assert "## Server view (/metrics) vs client" in md
    assert "| itl | `vllm:inter_token_latency_seconds` | 5.308 | 4.890 | -0.418 |" in md


def test_markdown_to_html_places_plots_and_escapes_raw_html():
    md = (
        "# t\n\n## Verdict\n\n**all bold**\n\nnot **all** bold\n\n"
        "| a | b |\n|---|---|\n| x \\| y | <script>alert(1)</script> |\n\n"
        "- item\n  - nested `code_x`\n\n## Next one (ms)\n\ntext _em_ snake_case\n"
    )
    html = markdown_to_html(md, {"Verdict": ["<svg>A</svg>"], "Next one (ms)": ["<svg>B</svg>"]})
    # a section's plots close that section: after its last block, before the next heading
    assert html.index("<ul>") < html.index("<svg>A</svg>") < html.index('<h2 id="next-one-ms">')
    assert html.rstrip().endswith("<svg>B</svg>")
    assert '<p class="verdict"><strong>all bold</strong></p>' in html
    assert "<p>not <strong>all</strong> bold</p>" in html
    assert "<td>x | y</td>" in html  # an escaped pipe stays inside its cell
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<li>nested <code>code_x</code></li>" in html and html.count("<ul>") == 2
    assert "<em>em</em> snake_case" in html
