"""What the commands print fits an 80-column terminal: no line is wider, no cell or header is cut
(a long cell wraps or folds, a header keeps its words), for bench (concurrency), predict
--what-if, compare, inspect, trace and the doctor's console output.

Each output is rendered twice, at 80 columns and at 400: the header of each table at 80 columns,
its wrapped pieces joined per column, reads the same as at 400 (where nothing wraps)."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console

from ceiling.cli import main
from ceiling.console import out

HERE = Path(__file__).parent
RUNTIME = HERE / "fixtures" / "runtime"
LOGS = HERE / "fixtures" / "logs"
TRACES = HERE / "fixtures" / "trace"


def _cli(*argv: str) -> Callable[[], None]:
    def run() -> None:
        assert main(list(argv)) == 0

    return run


def _bench() -> None:
    from ceiling.bench.results import load_result
    from ceiling.render.bench import render_result

    for name in ("default_conc.json", "max_num_seqs_1_conc_steps.json"):
        render_result(load_result(RUNTIME / name), out(), "ceiling-out/bench-1.json")


def _doctor() -> None:
    from ceiling.render import doctor
    from ceiling.report import load_doc

    doc = load_doc(HERE / "data" / "report" / "doctor-cpu.json")
    doctor.doctor(doc)  # type: ignore[arg-type]


OUTPUTS: dict[str, Callable[[], None]] = {
    "bench": _bench,
    "predict --what-if": _cli(
        "predict",
        "--model",
        "kimi-k2.5",
        "--gpu",
        "rtx-pro-6000",
        "--gpus",
        "8",
        "--link",
        "pcie5-switch",
        "--tp",
        "8",
        "--engine",
        "vllm",
        "--what-if",
    ),
    "predict llama": _cli(
        "predict",
        "--model",
        "llama-3.1-70b",
        "--gpu",
        "h100-sxm",
        "--tp",
        "4",
        "--batch",
        "8",
        "--what-if",
    ),
    "compare": _cli(
        "compare",
        str(RUNTIME / "default_conc.json"),
        str(RUNTIME / "max_num_seqs_1_conc.json"),
        str(RUNTIME / "tiny_kv_conc.json"),
    ),
    "inspect vllm": _cli("inspect", str(LOGS / "vllm_0.11_kimi_tp8_pcie.log")),
    "inspect died": _cli("inspect", str(LOGS / "vllm_cpu_0.32_num_scheduler_steps_real.log")),
    "inspect llama-server": _cli(
        "inspect", str(LOGS / "llama-server_b1-0c1e570_tiny_lv4_real.log")
    ),
    "trace": _cli(
        "trace",
        str(TRACES / "vllm-0.25-h200-qwen3-30b-a3b-b1-stack-rank0.pt.trace.json.gz"),
        "--model",
        "qwen3-30b-a3b",
        "--gpu",
        "h200",
    ),
    "doctor": _doctor,
}


def _render(run: Callable[[], None], columns: int, monkeypatch, capsys) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    out.cache_clear()  # the stdout console reads COLUMNS when it is made
    try:
        run()
    finally:
        out.cache_clear()
    return capsys.readouterr().out


def _headers(text: str) -> list[list[str]]:
    """Each table's header cells, a wrapped header's lines joined per column."""
    tables: list[list[str]] = []
    block: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("┃"):
            block.append([c.strip() for c in line.split("┃")[1:-1]])
        elif block:
            tables.append([" ".join(" ".join(col).split()) for col in zip(*block, strict=True)])
            block = []
    return tables


@pytest.mark.parametrize("name", list(OUTPUTS))
def test_output_fits_80_columns_and_cuts_no_header(name, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    narrow = _render(OUTPUTS[name], 80, monkeypatch, capsys)
    wide = _render(OUTPUTS[name], 400, monkeypatch, capsys)
    assert narrow.strip()
    too_wide = [line for line in narrow.splitlines() if cell_len(line) > 80]
    assert not too_wide, f"{name}: {len(too_wide)} lines over 80 columns:\n" + "\n".join(too_wide)
    assert "…" not in narrow, f"{name}: a cell or header cut with an ellipsis"
    assert _headers(narrow) == _headers(wide), f"{name}: a header cut or folded mid-word"


def test_the_header_check_catches_a_cut_header():
    """The check itself: a column too narrow for its header is caught."""
    from rich.table import Table

    def cut(width: int) -> str:
        t = Table()
        for h in ("level", "ok/failed", "TTFT ms mean/p99", "decode tok/s/stream [95% CI]"):
            t.add_column(h)
        t.add_row("c=1", "8/0", "214.82", "1653.3 [1650.1, 1656.5]")
        buf = io.StringIO()
        Console(file=buf, width=width).print(t)
        return buf.getvalue()

    assert _headers(cut(30)) != _headers(cut(400))
    assert re.search("…", cut(30))
