"""`ceiling trace FILE...`: the report (JSON keys), files written, one-line errors."""

from __future__ import annotations

import json

import pytest
from tests.trace_synth import Synth

from ceiling.cli import main
from ceiling.spec.profile import load_profile
from ceiling.trace.measured import IDLE

STEP = [
    ("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT", 600.0),
    ("void flash_fwd_splitkv_kernel<x>(x)", 90.0),
    ("void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(x)", 30.0),
    ("weird_kernel", 3.0),
]


@pytest.fixture
def trace_file(tmp_path):
    s = Synth(meta={"vllm_version": '"0.32.0"'})
    for _ in range(6):
        s.gpu_step(STEP, "execute_context_0(0)_generation_1(1)", gap=200.0)
    return s.write(tmp_path / "vllm_rank0.json.gz", gz=True)


def test_json_report_has_every_section(trace_file, tmp_path, capsys):
    out, prof = tmp_path / "rep.json", tmp_path / "prof.json"
    rc = main(["trace", str(trace_file), "--model", "llama-3.1-8b", "--gpu", "h200", "--json",
               "--out", str(out), "--profile-out", str(prof)])  # fmt: skip
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    d = json.loads(cap.out)
    assert d == json.loads(out.read_text())
    sp = d["split"]
    for key in ("schema_version", "step_ms", "idle_ms", "classes", "coverage", "unmatched",
                "top_kernels", "overlap", "per_step", "ranks", "steps", "batch"):  # fmt: skip
        assert key in sp, key
    assert sp["engine"] == "vllm" and sp["engine_version"] == "0.32.0" and sp["batch"] == 1
    assert [u["name"] for u in sp["unmatched"]] == ["weird_kernel"]
    assert sum(c["ms"] for c in sp["classes"]) + sp["idle_ms"] == pytest.approx(sp["step_ms"])
    rows = {r["op_class"]: r for r in d["measured"]["rows"]}
    assert rows["gemm"]["measured_ms"] == pytest.approx(0.6)
    assert rows["gemm"]["expected_ms"] > 0 and rows["gemm"]["bound_ms"] > 0
    assert rows[IDLE]["predict_ops"] == ["host"]
    assert d["measured"]["step_ms"] == pytest.approx(sp["step_ms"])
    assert d["predicted_step_ms"] > 0 and "llama-3.1-8b" in d["prediction"]
    assert load_profile(prof).trace_ops


def test_human_output_names_the_step_and_unmatched(trace_file, capsys):
    assert main(["trace", str(trace_file)]) == 0
    text = capsys.readouterr().out
    assert "measured step 0.923 ms" in text
    assert "unmatched kernels (1)" in text and "weird_kernel" in text
    assert "vLLM execute_context" in text


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["trace", "/nonexistent/t.json"], "trace not found"),
        (["trace", "{f}", "--window", "9:3"], "START < END"),
        (["trace", "{f}", "--model", "llama-3.1-8b"], "--model needs --gpu"),
    ],
)
def test_errors_are_one_line_with_fix(trace_file, capsys, argv, needle):
    argv = [a.replace("{f}", str(trace_file)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "fix:" in err and "Traceback" not in err


def test_report_section_markdown_and_html(trace_file, tmp_path, capsys):
    md, html = tmp_path / "t.md", tmp_path / "t.html"
    base = ["trace", str(trace_file), "--model", "llama-3.1-8b", "--gpu", "h200"]
    assert main([*base, "--report", str(md)]) == 0
    assert main([*base, "--report", str(html)]) == 0
    capsys.readouterr()
    text = md.read_text()
    assert "## Measured step (engine trace)" in text
    assert "| class | measured ms | expected ms | bound ms | gap over bound ms |" in text
    assert "Top kernels:" in text and "Unmatched kernels (1" in text and "weird_kernel" in text
    page = html.read_text()
    assert 'class="plot plot-stacked-step"' in page
    for label in ("measured", "expected", "bound"):
        assert f">{label}<" in page


def test_doctor_report_shows_each_recorded_window():
    from pathlib import Path

    from ceiling.report import load_doc
    from ceiling.report.html import render_html
    from ceiling.report.markdown import render_markdown
    from ceiling.trace import read_trace, split
    from ceiling.trace.capture import TraceCapture

    here = Path(__file__).parent
    doc = load_doc(here / "data" / "report" / "doctor-cpu.json")
    sp = split(
        [read_trace(here / "fixtures" / "trace" / "vllm-cpu-0.32-tiny-rank0.pt.trace.json.gz")]
    )
    win = dict(url="http://127.0.0.1:1", engine="vllm", steps_asked=12, recorded=True,
               files=["rank0.json.gz"], split=sp)  # fmt: skip
    doc.traces = [TraceCapture(label="single", **win), TraceCapture(label="concurrency 4", **win),
                  TraceCapture(label="concurrency 8", url="http://x", engine="vllm",
                               steps_asked=12, recorded=False, why_not="no profiler")]  # fmt: skip
    md = render_markdown(doc)
    assert "## Measured step (engine trace): single" in md
    assert "## Measured step (engine trace): concurrency 4" in md
    assert "concurrency 8" not in md.split("## Measured step")[-1].split("\n")[0]
    single = md.split("## Measured step (engine trace): single")[1].split("## ")[0]
    assert doc.prediction is not None and doc.prediction.expected is None  # a CPU's floors
    assert "no per-op figures to set beside the classes" in single
    page = render_html(doc)
    assert page.count('class="plot plot-stacked-step"') == 2
    # the single window's rows are the verdict's own when the result has them (one comparison)
    from ceiling.report.trace import doctor_reports
    from ceiling.trace.measured import measured_split

    assert doc.verdict is not None
    doc.verdict.measured = measured_split(sp, doc.prediction, "single", ["rank0.json.gz"])
    doc.verdict.measured.rows[0].expected_ms = 123.0  # a figure only the verdict's rows carry
    reps = doctor_reports(doc)
    assert reps[0].measured == doc.verdict.measured
    assert "123.0000" in render_markdown(doc)
    assert reps[1].measured is None  # a concurrency window: predict's figures are at batch 1
