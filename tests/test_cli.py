"""The CLI's contract: help works, expected failures are one line with a fix, no traceback."""

from __future__ import annotations

import subprocess
import sys

from ceiling.cli import main


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip()


def test_unknown_command_is_usage_error():
    assert main(["no-such-command"]) == 2


def test_help_lists_groups():
    proc = subprocess.run(
        [sys.executable, "-m", "ceiling", "--help"], capture_output=True, text=True, check=True
    )
    assert "predict" in proc.stdout
