"""``ceiling report bench.json``: a plain bench result gets its report (percentiles per level,
SLOs, the throughput/latency curve with the knee and SLO lines, the distributions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ceiling.bench.config import BenchConfig
from ceiling.bench.results import CapacityPoint, CapacityResult, LevelResult, RunResult
from ceiling.bench.runner import run_bench
from ceiling.bench.slo import SloCheck, parse_slos
from ceiling.cli import main
from ceiling.report import render_file
from sse_server import Plan, SSEServer

pytestmark = pytest.mark.timeout(120)


def test_report_renders_a_plain_bench_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    with SSEServer(Plan(ttft_s=0.005, itl_s=0.002)) as srv:
        cfg = BenchConfig(
            url=srv.url, mode="concurrency", concurrency=[1, 2], max_tokens=6, requests=4,
            warmup=0, out=out, slo=parse_slos("ttft:p99<=1s,itl:p90<=1ms"),
            percentiles=[50, 99.9],
        )  # fmt: skip
        run_bench(cfg, progress=False)
    rc = main(["report", str(out), "--json"])
    assert rc == 0
    paths = json.loads(capsys.readouterr().out)
    md = Path(paths["md"]).read_text()
    assert Path(paths["md"]).name == "bench-report.md"  # beside it, named after the result
    assert "## Latency percentiles per level" in md
    assert "| level | mean | p50 | p90 | p99 | p99.9 |" in md  # chosen + the SLOs' own
    assert md.count("| c=1 |") >= 5 and md.count("| c=2 |") >= 5
    assert "| c=2 | ttft:p99<=1000ms |" in md and "itl:p90<=1ms" in md
    html = Path(paths["html"]).read_text()
    assert html.count("plot-curve") >= 2 and "plot-histogram" in html  # TTFT's
    assert "ITL distribution" in html  # per-chunk gaps are kept with --save-detailed only
    assert "ttft:p99&lt;=1000ms" in html or "ttft:p99<=1000ms" in html  # the SLO line


def _capacity_run() -> RunResult:
    check = SloCheck(
        slo="ttft:p99<=60ms", metric="ttft", stat="p99", threshold_ms=60.0, value_ms=30.0,
        met=True, missed_requests=0,
    )  # fmt: skip
    levels = [
        LevelResult(request_rate=r, request_throughput=r * 0.98, completed=100,
                    good_completed=100 if r <= 170 else 70, slo=[check],
                    p50_ttft_ms=20.0 + r / 10, p99_ttft_ms=30.0 + r / 5)  # type: ignore[call-arg]
        for r in (80.0, 160.0, 170.0, 180.0)
    ]  # fmt: skip
    cap = CapacityResult(
        knee_rate=170.0, first_failing_rate=180.0, binding_slo="ttft:p99<=60ms", tolerance=0.05,
        precision=0.02, level_rule="each level sent max(160, ceil(rate x 0.1 s)) requests",
        stopped="bracketed within 2%",
        curve=[CapacityPoint(rate=lv.request_rate or 0, sent=100, good_completed=lv.good_completed
                             or 0, request_goodput=None, request_throughput=None,
                             passed=(lv.request_rate or 0) <= 170) for lv in levels],
    )  # fmt: skip
    return RunResult(mode="capacity", levels=levels, capacity=cap)


def test_report_of_a_capacity_search_shows_the_knee(tmp_path: Path) -> None:
    f = tmp_path / "cap.json"
    f.write_text(_capacity_run().model_dump_json())
    paths = render_file(f)
    md = Path(paths["md"]).read_text()
    assert "**170 req/s within the SLOs**" in md and "binding SLO: ttft:p99<=60ms" in md
    assert "| 180 | 100 | 70 |" in md
    html = Path(paths["html"]).read_text()
    assert "knee 170 req/s" in html
