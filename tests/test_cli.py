"""The CLI's contract: help lists every command, expected failures are one line with a fix and a
non-zero exit, usage errors exit 2, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

import typer

import ceiling
from ceiling.cli import _register_all, app, main
from ceiling.sweep.schema import SweepResult, SweepVerdict


def _ceiling(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ceiling", *args], capture_output=True, text=True, timeout=60
    )


def test_version_is_the_installed_distributions(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == ceiling.__version__ == version("ceiling")


def test_unknown_command_is_a_usage_error_that_names_it(capsys):
    assert main(["no-such-command"]) == 2
    err = capsys.readouterr().err
    assert "No such command 'no-such-command'" in err and "Traceback" not in err


def test_help_lists_every_registered_command():
    _register_all()
    names = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert {"predict", "bench", "compare", "doctor", "sweep", "report", "probe"} <= names
    proc = _ceiling("--help")
    assert proc.returncode == 0, proc.stderr
    section = proc.stdout.split("\nCommands:\n")[1].split("\n\n")[0]  # up to a blank line
    listed = {line.split()[0] for line in section.splitlines() if line.startswith("  ")}
    assert listed == names


def test_expected_failure_is_error_and_fix_lines_not_a_traceback(tmp_path):
    missing = tmp_path / "nope.json"
    proc = _ceiling("report", str(missing))
    assert proc.returncode == 2  # CeilingError's default exit code (a usage-type failure)
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        f"error: result file not found: {missing}",
        "  fix: pass the doctor.json, sweep.json or bench result that ceiling wrote",
    ]
    assert proc.stdout == ""


def test_json_output_is_parseable_and_alone_on_stdout(tmp_path):
    doc = tmp_path / "sweep.json"
    verdict = SweepVerdict(headline="No variant significantly beats the baseline b.")
    result = SweepResult(
        title="t", plan=None, ledger="", baseline="b", variants=[], comparison=[], verdict=verdict
    )
    doc.write_text(result.model_dump_json())
    proc = _ceiling("report", str(doc), "--out-dir", str(tmp_path / "r"), "--json")
    assert proc.returncode == 0, proc.stderr
    paths = json.loads(proc.stdout)
    assert set(paths) == {"md", "html"}
    assert paths["html"] == str(tmp_path / "r" / "report.html")
