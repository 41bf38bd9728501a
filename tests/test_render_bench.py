"""``ceiling bench`` and ``compare`` as printed: a column labelled p99 shows the p99, a long
file name or verdict is never cut, percentages in the warnings read like every other one."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from ceiling.bench.compare import compare
from ceiling.bench.results import load_result
from ceiling.render.bench import render_comparison, render_result

RUNTIME = Path(__file__).parent / "fixtures" / "runtime"


def _printed(render, *args) -> str:
    buf = io.StringIO()
    render(*args, Console(file=buf, width=80, highlight=False))
    return buf.getvalue()


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.replace("┃", "│").split("│")[1:-1]]


def _table(text: str, title: str) -> tuple[list[str], list[list[str]]]:
    """The one-line header and the rows of the table under ``title``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    body = lines[start + 1 :]
    end = next(i for i, line in enumerate(body) if line.startswith("└"))
    header = [_cells(line) for line in body[:end] if line.startswith("┃")]
    assert len(header) == 1, "a header wrapped over several lines"
    rows = [_cells(line) for line in body[:end] if line.startswith("│")]
    return header[0], rows


def test_every_latency_column_shows_its_own_statistic():
    result = load_result(RUNTIME / "default_conc.json")
    lv = result.levels[0]
    assert lv.p99_ttft_ms is not None and lv.mean_ttft_ms is not None
    assert f"{lv.p99_ttft_ms:.2f}" != f"{lv.mean_ttft_ms:.2f}"
    header, rows = _table(_printed(render_result, result), "latency (ms)")
    row = rows[0]
    assert row[0] == "c=1"
    for label, value in (
        ("TTFT mean", lv.mean_ttft_ms),
        ("TTFT p99", lv.p99_ttft_ms),
        ("TPOT mean", lv.mean_tpot_ms),
        ("TPOT p99", lv.p99_tpot_ms),
        ("ITL p99", lv.p99_itl_ms),
    ):
        assert row[header.index(label)] == f"{value:.2f}", label
    for label in header:  # a column named p99 holds a p99, a column named mean a mean
        stat = label.split()[-1]
        assert stat in ("level", "ok/failed", "mean", "p99"), label


def test_compare_names_long_files_by_a_legend_and_keeps_the_verdict_whole():
    files = ["default_conc.json", "max_num_seqs_1_conc.json", "tiny_kv_conc.json"]
    comp = compare([load_result(RUNTIME / f) for f in files], labels=files)
    text = _printed(render_comparison, comp)
    assert "…" not in text
    assert "B1: max_num_seqs_1_conc.json" in text and "B2: tiny_kv_conc.json" in text
    _, rows = _table(text.replace("decode_tok_s_per_stream: against default_conc.json",
                                  "TITLE"), "TITLE")  # fmt: skip
    verdicts = [r[-1] for r in rows if r[-1]]
    wrapped = " ".join(verdicts)  # a verdict wraps over lines, whole words each
    for row in comp.rows:
        assert row.verdict in wrapped


def test_lag_and_burst_warnings_write_percentages_like_every_other():
    from ceiling.bench.assemble import run_warnings

    result = load_result(RUNTIME / "default_conc.json")
    lv = result.levels[0].model_copy()
    lv.mean_itl_ms = 0.6
    lv.__pydantic_extra__ = {"burst_chunk_share": 0.9712}
    warnings = run_warnings([lv], {"mean": 7.1, "p99": 160.85, "max": 200.0}, False, "usage")
    assert any(w.startswith("97 % of chunks arrived together") for w in warnings), warnings
    assert any("lag p99 160.85 ms is 26,808 % of the mean ITL" in w for w in warnings), warnings


def test_server_overhead_keeps_its_sign():
    result = load_result(RUNTIME / "default_conc.json")
    text = _printed(render_result, result)
    assert "+-" not in text and "(-1.47)" in " ".join(text.split())


def test_a_note_is_printed_as_a_note_not_a_warning():
    result = load_result(RUNTIME / "default_conc.json")
    result.notes = ["the server counted every prompt +1 tokens against the intended length"]
    result.warnings = []
    text = _printed(render_result, result)
    assert "note: the server counted every prompt +1 tokens" in text
    assert "warning" not in text
