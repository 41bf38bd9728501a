"""Exit codes come from one enum, every exception is mapped to one in one place, and with
``--json`` an error is also one JSON object on stdout."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
from typer.exceptions import TyperException

from ceiling import interrupts
from ceiling.cli import main
from ceiling.errors import CeilingError, ExitStatus, error_payload, exit_status

SRC = Path(__file__).resolve().parent.parent / "src" / "ceiling"


def test_the_enum_is_the_documented_codes():
    assert {s.name: int(s) for s in ExitStatus} == {
        "OK": 0,
        "FAILED": 1,
        "INPUT": 2,
        "ENGINE": 3,
        "SERVER": 4,
        "INTERRUPTED": 130,
    }
    assert ExitStatus.SERVER.kind == "server"
    docs = (SRC.parent.parent / "docs" / "failures.md").read_text()
    for status in ExitStatus:  # every code has its row in docs/failures.md
        assert f"| {int(status)} | {status.kind} |" in docs


def test_every_exception_maps_in_one_place():
    assert exit_status(CeilingError("x")) is ExitStatus.INPUT
    assert exit_status(CeilingError("x", exit_code=ExitStatus.ENGINE)) is ExitStatus.ENGINE
    assert exit_status(CeilingError("x", exit_code=4)) is ExitStatus.SERVER  # an int is coerced
    assert exit_status(KeyboardInterrupt()) is ExitStatus.INTERRUPTED
    from typer._click.exceptions import NoSuchOption

    assert exit_status(NoSuchOption("--nope")) is ExitStatus.INPUT
    assert isinstance(NoSuchOption("--nope"), TyperException)
    assert exit_status(ValueError("a bug")) is None  # a bug keeps its traceback
    with pytest.raises(ValueError):
        CeilingError("x", exit_code=7)  # not a code ceiling returns


def test_no_exit_code_literal_outside_the_enum():
    """``typer.Exit(1)`` / ``exit_code=3`` in a command would bypass the enum."""
    literal = re.compile(r"typer\.Exit\(\d|exit_code=\d|EXIT_[A-Z]+\b")
    hits = [
        f"{p.relative_to(SRC)}:{n}"
        for p in SRC.rglob("*.py")
        if p.name != "errors.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if literal.search(line)
    ]
    assert hits == []


def _run(capsys, argv):
    code = main(argv)
    got = capsys.readouterr()
    return code, got.out, got.err


def test_json_error_is_one_object_on_stdout_besides_the_stderr_lines(capsys, tmp_path):
    code, out, err = _run(capsys, ["report", str(tmp_path / "nope.json"), "--json"])
    assert code == ExitStatus.INPUT
    doc = json.loads(out)
    assert doc == {
        "error": f"result file not found: {tmp_path / 'nope.json'}",
        "fix": doc["fix"],
        "exit_code": 2,
        "kind": "input",
    }
    assert doc["fix"] and f"error: {doc['error']}" in err and f"fix: {doc['fix']}" in err
    code, out, err = _run(capsys, ["report", str(tmp_path / "nope.json")])
    assert code == 2 and out == "" and "error:" in err  # without --json, stderr only


def test_json_usage_error_and_server_error(capsys):
    code, out, err = _run(capsys, ["bench", "--no-such-option", "--json"])
    assert code == ExitStatus.INPUT and "Usage:" in err
    doc = json.loads(out)
    assert doc["kind"] == "input" and doc["exit_code"] == 2 and "--no-such-option" in doc["error"]

    code, out, err = _run(capsys, ["bench", "--url", "http://127.0.0.1:9", "--quiet", "--json"])
    assert code == ExitStatus.SERVER
    doc = json.loads(out)
    assert doc["kind"] == "server" and doc["exit_code"] == 4 and doc["error"] in err


def test_json_interrupt_is_an_object_too(capsys, monkeypatch, tmp_path):
    def interrupted(*_a, **_k):
        os.kill(os.getpid(), signal.SIGINT)  # through ceiling's handler, as a Ctrl-C would

    monkeypatch.setattr("ceiling.report.render_file", interrupted)
    try:
        code, out, err = _run(capsys, ["report", str(tmp_path / "x.json"), "--json"])
    finally:
        interrupts.reset()
    assert code == ExitStatus.INTERRUPTED
    assert json.loads(out) == error_payload("interrupted (Ctrl-C)", None, 130)
    assert "interrupted (Ctrl-C)" in err


def test_a_command_that_printed_its_result_gets_no_second_document(capsys, tmp_path):
    bad = tmp_path / "v.yaml"
    bad.write_text("engine: vllm\nmodel: /nope\nargs: {no-such-flag-at-all: 1}\n")
    code, out, _ = _run(capsys, ["preflight", str(bad), "--json"])
    assert code == ExitStatus.FAILED
    doc = json.loads(out)  # exactly one document (json.loads refuses two): the report
    assert doc["reports"][0]["problems"] and "error" not in doc
