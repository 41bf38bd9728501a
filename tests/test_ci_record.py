"""scripts/ci_record.py: a run's figures into the CI page (docs/ci.md), newest first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from script_module import load_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "ci_record.py"
ci_record = load_script(SCRIPT)

PAGE = """# CI
text before
<!-- ci:test:begin -->
| date | total |
|---|---|
| old row 1 |
| old row 2 |
<!-- ci:test:end -->
between
<!-- ci:demo:begin -->
| date | step |
|---|---|
<!-- ci:demo:end -->
text after
"""


def test_a_row_goes_first_and_the_rest_of_the_page_stays():
    out = ci_record.insert_row(PAGE, "test", "| new |")
    block = out.split("<!-- ci:test:begin -->\n")[1].split("<!-- ci:test:end -->")[0]
    assert block.splitlines() == [
        "| date | total |",
        "|---|---|",
        "| new |",
        "| old row 1 |",
        "| old row 2 |",
    ]
    assert out.startswith("# CI\ntext before\n") and out.endswith("text after\n")
    assert (
        "between\n<!-- ci:demo:begin -->\n| date | step |\n|---|---|\n<!-- ci:demo:end -->" in out
    )


def test_the_table_keeps_the_last_rows_only():
    page = PAGE
    for i in range(5):
        page = ci_record.insert_row(page, "demo", f"| run {i} |", keep=3)
    block = page.split("<!-- ci:demo:begin -->\n")[1].split("<!-- ci:demo:end -->")[0]
    assert block.splitlines()[2:] == ["| run 4 |", "| run 3 |", "| run 2 |"]


def test_a_page_without_the_markers_is_refused():
    with pytest.raises(ci_record.PageError):
        ci_record.insert_row("# CI\nno table\n", "test", "| new |")


@pytest.mark.parametrize(
    ("line", "counts"),
    [
        (
            "===== 718 passed, 2 skipped, 1 rerun in 612.31s (0:10:12) =====",
            {"passed": 718, "skipped": 2, "rerun": 1},
        ),
        (
            "= 3 failed, 700 passed, 1 error, 2 reruns in 9.10s =",
            {"failed": 3, "passed": 700, "error": 1, "rerun": 2},
        ),
        ("\x1b[32m\x1b[1m5 passed\x1b[0m\x1b[32m in 0.51s\x1b[0m", {"passed": 5}),
    ],
)
def test_pytest_counts_read_the_last_summary_line(line, counts):
    log = "tests/test_x.py ....\n3 passed in 1.0s  <- an earlier line\n" + line + "\n"
    assert ci_record.pytest_counts(log) == counts


def test_test_sh_writes_its_row(tmp_path):
    """The command line test.sh runs at exit: phases summed, counts, status, the page rewritten."""
    page = tmp_path / "ci.md"
    page.write_text((REPO / "docs" / "ci.md").read_text())
    phases = tmp_path / "phases.tsv"
    phases.write_text(
        "venv\t61.6\nvllm\t2.0\nlint\t3\ntypes\t30\ntests\t200\nllamacpp\t340\nengine\t400\n"
        "engine\t40\n"  # a phase recorded twice is summed
    )
    log = tmp_path / "pytest.log"
    log.write_text("==== 718 passed, 2 skipped in 200.0s ====\n")
    engine_log = tmp_path / "pytest-engine.log"  # the second session: its counts are added
    engine_log.write_text("==== 40 passed, 1 rerun in 400.0s ====\n")
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "test",
            "--page",
            str(page),
            "--phases",
            str(phases),
            "--rc",
            "1",
            "--pytest-log",
            str(log),
            "--pytest-log",
            str(engine_log),
            "--args=-x",  # as test.sh passes it: pytest's options start with a dash
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    row = page.read_text().split("<!-- ci:test:begin -->\n")[1].splitlines()[2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    # date, commit, machine, venv, system, vllm, lint, types, tests, llamacpp, engine, total,
    # outcome counts (the two sessions', summed), status
    assert cells[3:12] == [
        *("1:02", "-", "0:02", "0:03", "0:30", "3:20", "5:40", "7:20"),
        "**17:57**",
    ]
    assert cells[12] == "758 passed, 2 skipped, 1 rerun" and cells[13] == "rc 1 `-x`"
    assert "cores" in cells[2] and "load" in cells[2]


def test_demo_row_reads_the_step_the_doctor_measured(tmp_path):
    doctor = tmp_path / "doctor.json"
    doctor.write_text(json.dumps({"verdict": {"bottleneck": {"step_ms": 1.8649}}}))
    row = ci_record.demo_row({"venv": 10, "vllm": 3, "model": 5, "doctor": 150}, doctor, 0)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3:] == ["0:10", "0:03", "0:05", "2:30", "**2:48**", "1.86 ms", "ok"]
    missing = ci_record.demo_row({"venv": 10}, tmp_path / "absent.json", 1)
    assert missing.endswith("| - | rc 1 |")  # a failed demo is recorded, with no step


def test_a_run_that_failed_before_the_tests_is_recorded(tmp_path):
    """test.sh stopped at a phase before pytest (mypy failed): no pytest log, the row is still
    written, with the phases that ran and the exit status."""
    page = tmp_path / "ci.md"
    page.write_text((REPO / "docs" / "ci.md").read_text())
    phases = tmp_path / "phases.tsv"
    phases.write_text("venv\t600\nvllm\t20\nlint\t10\n")
    rc = ci_record.main(
        ["test", "--page", str(page), "--phases", str(phases), "--rc", "1",
         "--pytest-log", str(tmp_path / "absent.log"), "--args="]
    )  # fmt: skip
    assert rc == 0
    row = page.read_text().split("<!-- ci:test:begin -->\n")[1].splitlines()[2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3:14] == ["10:00", "-", "0:20", "0:10", "-", "-", "-", "-", "**10:30**",
                           "no summary", "rc 1"]  # fmt: skip
