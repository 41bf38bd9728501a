"""``ceiling bench`` from the command line: --json, --out, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ceiling.cli import main
from sse_server import Plan, SSEServer


def test_bench_json_and_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.json"
    with SSEServer(Plan()) as srv:
        rc = main(
            [
                "bench",
                "--url",
                srv.url,
                "--max-tokens",
                "8",
                "--requests",
                "2",
                "--warmup",
                "0",
                "--json",
                "--quiet",
                "--out",
                str(out),
            ]
        )
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["completed"] == 2 and summary["schema_version"] == 1
    assert "per_request" not in summary
    assert json.loads(out.read_text())["per_request"]["output_tokens"] == [8, 8]


def test_bench_human_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SSEServer(Plan()) as srv:
        rc = main(
            [
                "bench",
                "--url",
                srv.url,
                "--mode",
                "concurrency",
                "--concurrency",
                "1,2",
                "--max-tokens",
                "8",
                "--requests",
                "2",
                "--quiet",
                "--out",
                str(tmp_path / "r.json"),
            ]
        )
    assert rc == 0
    text = capsys.readouterr().out
    assert "c=1" in text and "c=2" in text


def test_unreachable_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--url", "http://127.0.0.1:9", "--quiet"]) == 4  # the server
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach") and "fix:" in err and "Traceback" not in err


def test_bad_options_are_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--mode", "rate", "--quiet"]) == 2
    assert "--rate" in capsys.readouterr().err
    assert main(["bench", "--mode", "concurrency", "--concurrency", "1,x"]) == 2
    assert main(["bench", "--mode", "sideways", "--quiet"]) == 2
    assert main(["bench", "--repeat", "0", "--quiet"]) == 2
    err = capsys.readouterr().err
    # --mode is a choice: Click refuses it, naming the choices (docs/cli.md)
    assert "Invalid value for '--mode'" in err and "'concurrency'" in err
    assert "bad --repeat" in err and "Traceback" not in err


def test_all_requests_failing_exits_non_zero(tmp_path: Path) -> None:
    with SSEServer(Plan(status=503)) as srv:
        rc = main(
            [
                "bench",
                "--url",
                srv.url,
                "--requests",
                "2",
                "--warmup",
                "0",
                "--quiet",
                "--out",
                str(tmp_path / "r.json"),
            ]
        )
    assert rc == 1
    assert json.loads((tmp_path / "r.json").read_text())["errors"] == {"http_5xx": 2}


def test_ctrl_c_on_the_command_line_writes_a_partial_result(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "int.json"
    with SSEServer(Plan(itl_s=0.002)) as srv:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ceiling",
                "bench",
                "--url",
                srv.url,
                "--max-tokens",
                "50",
                "--requests",
                "1000",
                "--warmup",
                "0",
                "--quiet",
                "--out",
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while srv.n_requests < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "partial result written" in err and "Traceback" not in err
    data = json.loads(out.read_text())
    assert data["partial"] is True and data["completed"] >= 2


def test_logit_bias_is_sent_as_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SSEServer(Plan()) as srv:
        rc = main(
            [
                "bench", "--url", srv.url, "--max-tokens", "4", "--requests", "1",
                "--warmup", "0", "--no-ignore-eos", "--logit-bias", '{"1": -100, "2": -100}',
                "--quiet", "--json", "--out", str(tmp_path / "run.json"),
            ]
        )  # fmt: skip
        body = srv.bodies[0]
    assert rc == 0
    assert body["logit_bias"] == {"1": -100.0, "2": -100.0}
    assert "ignore_eos" not in body and "min_tokens" not in body
    assert main(["bench", "--logit-bias", "[1, 2]", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "bad --logit-bias" in err and "Traceback" not in err


def test_out_to_a_device_or_fifo_is_written_into_never_replaced(tmp_path):
    """`--out /dev/null` must not turn the device node into a regular file (the atomic
    tmp-then-rename write would replace what other processes own)."""
    import os
    import stat
    import threading

    from ceiling.bench.results import RunResult, save_result

    result = RunResult.model_validate({})  # every field has a default
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    save_result(result, fifo)
    reader.join(timeout=10)
    assert stat.S_ISFIFO(fifo.stat().st_mode)  # still a FIFO
    assert got and '"schema_version"' in got[0]
    assert not (tmp_path / "pipe.tmp").exists()
    save_result(result, Path(os.devnull))
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
