"""Progress without a terminal, stalls that end a stage, and messages that are never Rich markup
(issue 25)."""

from __future__ import annotations

import json
import time

from ceiling.bench import runner
from ceiling.cli import main
from sse_server import Plan, SSEServer


def test_bench_says_where_it_stands_without_a_terminal(capsys, monkeypatch):
    monkeypatch.setattr(runner, "HEARTBEAT_S", 0.3)
    with SSEServer(Plan(itl_s=0.02)) as srv:  # 20 tokens: ~0.4 s a request
        argv = ["bench", "--url", srv.url, "--max-tokens", "20", "--requests", "6", "--warmup", "0"]
        assert main([*argv, "--out", "/dev/null"]) == 0
    err = capsys.readouterr().err  # pytest's stderr is no terminal: no live bars drawn
    lines = [ln for ln in err.splitlines() if ln.startswith("bench: ")]
    assert len(lines) >= 3, err
    assert "requests done" in lines[-1] and "/6" in lines[-1]


def test_quiet_bench_prints_no_progress(capsys, monkeypatch):
    monkeypatch.setattr(runner, "HEARTBEAT_S", 0.2)
    with SSEServer(Plan(itl_s=0.02)) as srv:
        argv = ["bench", "--url", srv.url, "--max-tokens", "20", "--requests", "3", "--quiet"]
        assert main([*argv, "--out", "/dev/null"]) == 0
    assert "requests done" not in capsys.readouterr().err


def test_a_stalled_stream_ends_the_run_at_once(tmp_path, capsys):
    """Streams that hang mid-way: the second stall in a row ends the stage with a statement,
    instead of every further request waiting as long (11 silent minutes in a doctor run)."""
    with SSEServer(Plan(itl_s=0.001, stall_at=3, stall_s=60)) as srv:
        t0 = time.monotonic()
        argv = ["bench", "--url", srv.url, "--max-tokens", "10", "--requests", "5", "--warmup",
                "0", "--stall-timeout", "1", "--quiet", "--out", str(tmp_path / "r.json")]  # fmt: skip
        rc = main(argv)
        took = time.monotonic() - t0
        sent = srv.n_requests
    err = capsys.readouterr().err
    assert rc == 1 and "stalled" in err and "--stall-timeout" in err, err
    assert sent == 2, "requests went on after the stalls"
    assert took < 30  # bounded by one stall, not 5 (a loose bound for a loaded machine)
    assert json.loads((tmp_path / "r.json").read_text())["stalled"]


def test_doctor_gives_no_verdict_after_a_stall(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64}))
    with SSEServer(
        lambda i, _b: Plan(itl_s=0.001, stall_at=2 if i >= 2 else None, stall_s=60)
    ) as srv:
        argv = ["doctor", "--url", srv.url, "--model", str(model), "--max-tokens", "8",
                "--repeat", "3", "--concurrency", "none", "--no-telemetry", "--no-measure-cpu",
                "--no-sanity", "--stall-timeout", "1", "--out-dir", str(tmp_path / "o")]  # fmt: skip
        rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 1 and "stalled" in err, err
    doc = json.loads((tmp_path / "o" / "doctor.json").read_text())
    assert doc["verdict"] is None


def test_markup_never_swallows_literal_text(capsys):
    from ceiling.console import Progress, say

    say("note: [gpu] and [bold]x[/bold] stay as they are")
    with Progress("starting [gpu]", enabled=True, lines=True) as p:
        p.update("loading [gpu] weights", key="loading")
    err = capsys.readouterr().err
    assert "[gpu] and [bold]x[/bold]" in err and "loading [gpu] weights" in err


def test_commbench_bars_say_where_they_stand_without_a_terminal(capsys):
    from ceiling.console import Bars

    with Bars("allreduce", heartbeat_s=0.1) as bars:
        time.sleep(0.35)  # ranks starting: no PROGRESS line yet
        bars.update("default x2", 3, 10)
        time.sleep(0.35)
    err = capsys.readouterr().err
    assert "allreduce: starting" in err and "allreduce: default x2 3/10" in err
