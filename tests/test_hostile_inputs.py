"""The named cases of issue 12 against the synthetic server: secrets in URLs, a doctor whose
requests all fail, /metrics after the server died, and signal handlers after a bench."""

from __future__ import annotations

import json
import signal

import pytest

from ceiling import interrupts
from ceiling.cli import main
from sse_server import Plan, SSEServer


def test_url_credentials_never_reach_the_result_or_the_terminal(tmp_path, capsys):
    key = "sk-in-the-url-31337"
    out = tmp_path / "r.json"
    with SSEServer(Plan(itl_s=0.001, ttft_s=0.005)) as srv:
        url = srv.url.replace("http://", f"http://user:{key}@")
        rc = main(["bench", "--url", url, "--max-tokens", "8", "--quiet", "--out", str(out)])
        assert rc == 0
        assert main(["bench", "--url", url, "--max-tokens", "8", "--quiet", "--json"]) == 0
    seen = capsys.readouterr()
    saved = out.read_text()
    for text in (saved, seen.out, seen.err):
        assert key not in text
    doc = json.loads(saved)
    assert doc["url"].startswith("http://***@") and doc["config"]["url"].startswith("http://***@")


def test_doctor_exits_1_when_every_request_failed(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64}))
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    with SSEServer(lambda i, _b: Plan(status=500, error_message="boom")) as srv:
        argv = ["doctor", "--url", srv.url, "--model-path", str(model), "--max-tokens", "8"]
        argv += ["--repeat", "1", "--concurrency", "none", "--no-telemetry", "--no-measure-cpu"]
        # the synthetic server has no model to judge: the sanity gate is off here
        rc = main([*argv, "--no-sanity", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "no request completed" in err
    doc = json.loads((tmp_path / "o" / "doctor.json").read_text())
    assert doc["bench"]["single"]["completed"] == 0  # the failed measurement is still written


def test_server_metrics_say_why_after_the_server_died(tmp_path):
    from ceiling.bench.config import BenchConfig
    from ceiling.bench.runner import run_bench

    with SSEServer(lambda i, _b: Plan(itl_s=0.002, die=i == 4)) as srv:
        cfg = BenchConfig(url=srv.url, max_tokens=16, requests=12, warmup=0, out=None)
        res = run_bench(cfg, progress=False)
    assert res.partial
    reason = (res.server_metrics or {}).get("reason", "")
    assert "no /metrics endpoint" not in reason
    assert "stopped" in reason


def test_bench_gives_the_signal_handlers_back(tmp_path):
    """asyncio's own removal would leave SIGTERM at its default (kill, no teardown): after a
    bench the CLI's handlers are in place again."""
    from ceiling.bench.config import BenchConfig
    from ceiling.bench.runner import run_bench

    previous = interrupts.install()
    try:
        with SSEServer(Plan(itl_s=0.001)) as srv:
            run_bench(BenchConfig(url=srv.url, max_tokens=4, requests=2), progress=False)
        assert signal.getsignal(signal.SIGTERM) is interrupts.handle
        assert signal.getsignal(signal.SIGINT) is interrupts.handle
    finally:
        interrupts.restore(previous)


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--out", "/proc/nope/x.json"],
        ["doctor", "--max-tokens", "0"],
        ["doctor", "--repeat", "-1"],
        ["launch", "--port", "-1", "x.yaml"],
        ["commbench", "--world-sizes", "0"],
        ["calibrate", "--cpu", "--scale", "-1"],
    ],
)
def test_issue_examples_fail_in_one_line_before_any_work(argv, capsys, tmp_path):
    if argv[0] in ("bench", "doctor"):
        argv = [*argv, "--url", "http://127.0.0.1:9"]
    if argv[0] == "doctor":
        argv += ["--out-dir", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "\n  fix: " in err and "Traceback" not in err
