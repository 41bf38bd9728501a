"""The named cases of issue 12 against the synthetic server: secrets in URLs, a doctor whose
requests all fail, /metrics after the server died, and signal handlers after a bench."""

from __future__ import annotations

import contextlib
import json
import re
import signal
from pathlib import Path

import pytest

from ceiling import interrupts
from ceiling.cli import main
from sse_server import Plan, SSEServer
from sweep_helpers import write_plan


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
        argv = ["doctor", "--url", srv.url, "--model", str(model), "--max-tokens", "8"]
        argv += ["--repeat", "1", "--concurrency", "none", "--no-telemetry", "--no-measure-cpu"]
        # the synthetic server has no model to judge: the sanity gate is off here
        rc = main([*argv, "--no-sanity", "--out-dir", str(tmp_path / "o")])
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


# ---- issue 25: the 13 causes of a traceback, each one line now ----------------------------


@pytest.fixture(scope="module")
def server():
    with SSEServer(Plan(itl_s=0.001)) as srv:
        yield srv


@pytest.fixture
def garbage_server():
    """Answers every connection with bytes that are not HTTP."""
    import socket
    import threading

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)

    def serve():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.recv(65536)
                conn.sendall(b"\x00\xffNOT HTTP AT ALL\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def _one_line_error(capsys, rc: int, code: int) -> str:
    err = capsys.readouterr().err
    assert rc == code, err
    assert "Traceback" not in err and "warning: " not in err, err
    assert ("error: " in err and "\n  fix: " in err) or "Error: Invalid value" in err, err
    return err


@pytest.mark.parametrize(
    "extra",
    [
        ["--input-len", "10000000000"],  # the prompt was allocated first: MemoryError
        ["--seed", "-1"],  # numpy: expected non-negative integer
        ["--mode", "rate", "--rate", "5", "--burstiness", "inf"],  # NaN arrival times
        ["--rate", "nan", "--mode", "rate"],
        ["--request-timeout", "inf"],
        ["--temperature", "nan"],
        ["--logit-bias", '{"1": Infinity}'],
    ],
)
def test_bench_values_at_the_edges(extra, server, capsys):
    rc = main(["bench", "--url", server.url, "--max-tokens", "2", "--requests", "1", "--quiet",
               *extra])  # fmt: skip
    _one_line_error(capsys, rc, 2)


def test_an_api_key_and_url_credentials_together(server, capsys, monkeypatch):
    monkeypatch.setenv("CEILING_API_KEY", "sk-env-key-424242")
    url = server.url.replace("http://", "http://user:pw@")
    rc = main(["bench", "--url", url, "--max-tokens", "2", "--requests", "1", "--quiet"])
    err = _one_line_error(capsys, rc, 2)
    assert "one Authorization header" in err and "sk-env-key-424242" not in err


def test_a_url_without_a_scheme_is_http(server, capsys):
    bare = server.url.removeprefix("http://")
    assert main(["bench", "--url", bare, "--max-tokens", "2", "--requests", "1", "--quiet"]) == 0
    for argv in (["bench", "--url", "ftp://127.0.0.1:21"], ["sanity", "--url", "ftp://h:21"]):
        _one_line_error(capsys, main(argv), 2)  # another scheme is bad input, not exit 4


@pytest.mark.parametrize("path", ["he alth", "health", "/h\nx", "http://x/health"])
def test_ready_with_a_bad_health_path(path, server, capsys):
    _one_line_error(capsys, main(["ready", "--url", server.url, "--path", path]), 2)


def test_non_http_bytes_from_the_server(garbage_server, capsys):
    argv = ["sanity", "--url", garbage_server, "--request-timeout", "3", "--no-reference"]
    _one_line_error(capsys, main(argv), 4)
    argv = ["ready", "--url", garbage_server, "--ready-timeout", "1"]
    _one_line_error(capsys, main(argv), 4)


def test_json_inputs_with_nan_or_infinity(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"num_hidden_layers": NaN, "hidden_size": Infinity}')
    err = _one_line_error(capsys, main(["predict", "--model", str(cfg), "--gpu", "H200"]), 2)
    assert "NaN" in err


def test_an_unbalanced_quote_in_variant_args(tmp_path, capsys):
    v = tmp_path / "v.yaml"
    v.write_text(f'engine: vllm\nmodel: {tmp_path}\nargs: "--max-model-len \'4096"\n')
    err = _one_line_error(capsys, main(["deploy", str(v), "--dry-run", "--image", "x:1"]), 2)
    assert "`args`" in err and "quote" in err


def test_a_huge_input_file_is_refused_not_read(tmp_path, capsys, monkeypatch):
    from ceiling import inputs

    monkeypatch.setattr(inputs, "MAX_INPUT_BYTES", 1 << 20)
    big = tmp_path / "huge.log"
    with big.open("wb") as fh:
        fh.truncate(8 << 20)  # sparse: 8 MiB of NULs without writing them
    _one_line_error(capsys, main(["inspect", str(big)]), 2)
    _one_line_error(capsys, main(["inspect", "/dev/zero"]), 2)  # grew to 19 GB before


def test_deploy_out_naming_an_existing_file(tmp_path, capsys):
    v = tmp_path / "v.yaml"
    v.write_text(f"engine: vllm\nmodel: {tmp_path}\n")
    f = tmp_path / "file"
    f.write_text("mine")
    argv = ["deploy", str(v), "--image", "x:1", "--no-validate", "--out-dir", str(f)]
    _one_line_error(capsys, main(argv), 2)
    assert f.read_text() == "mine"
    for bad in (["--gpus", "-1"], ["--ready-timeout", "-5"], ["--env-file", str(tmp_path)]):
        _one_line_error(capsys, main(["deploy", str(v), "--image", "x:1", *bad]), 2)


def test_a_full_disk_keeps_the_previous_result_and_rescues_the_new(server, tmp_path, capsys,
                                                                   monkeypatch):  # fmt: skip
    import errno

    from ceiling import outputs

    out = tmp_path / "r.json"
    out.write_text('{"previous": true}\n')

    def enospc(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs.os, "fsync", enospc)
    rc = main(["bench", "--url", server.url, "--max-tokens", "2", "--requests", "1", "--quiet",
               "--out", str(out)])  # fmt: skip
    err = _one_line_error(capsys, rc, 1)
    assert "No space left" in err and "previous r.json is unchanged" in err
    assert out.read_text() == '{"previous": true}\n'
    rescue = re.search(r"saved to (\S+\.json)", err)
    assert rescue and json.loads(Path(rescue.group(1)).read_text())["kind"]
    Path(rescue.group(1)).unlink()


# ---- issue 25: no verdict from a failed run -----------------------------------------------


def _tiny_model(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64}))
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    return model


def test_doctor_gives_no_verdict_when_9_of_10_requests_fail(tmp_path, capsys):
    """The doctor printed a verdict, exit 0, when 9 of 10 requests failed."""
    model = _tiny_model(tmp_path)
    with SSEServer(lambda i, _b: Plan(status=200 if i % 10 == 0 else 500)) as srv:
        argv = ["doctor", "--url", srv.url, "--model", str(model), "--max-tokens", "8"]
        argv += ["--repeat", "10", "--concurrency", "none", "--no-telemetry", "--no-measure-cpu"]
        rc = main([*argv, "--no-sanity", "--out-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "requests failed" in err and "no verdict" in err
    doc = json.loads((tmp_path / "o" / "doctor.json").read_text())
    assert doc["verdict"] is None
    assert any(s["name"] == "verdict" and s["status"] == "skipped" for s in doc["stages"])


def test_bench_fails_above_the_allowed_share_of_failed_requests(tmp_path, capsys):
    with SSEServer(lambda i, _b: Plan(status=500 if i % 4 == 1 else 200)) as srv:
        argv = ["bench", "--url", srv.url, "--max-tokens", "4", "--requests", "8", "--quiet",
                "--warmup", "0", "--out", str(tmp_path / "r.json")]  # fmt: skip
        rc = main(argv)
        err = _one_line_error(capsys, rc, 1)
        assert "of 8 requests failed" in err and "--max-failed-pct" in err
        assert json.loads((tmp_path / "r.json").read_text())["failed"] == 2  # result kept
        assert main([*argv, "--max-failed-pct", "50"]) == 0


def test_a_context_overflow_is_named_with_its_lengths(tmp_path, capsys):
    """It was reported as "the server rejects ignore_eos" and the run then "measured" a handful
    of tokens per request."""
    msg = ("This model's maximum context length is 2048 tokens. However, your prompt contains "
           "4000 input tokens, which exceeds this limit (ignore_eos, min_tokens)")  # fmt: skip
    with SSEServer(Plan(status=400, error_message=msg)) as srv:
        argv = ["bench", "--url", srv.url, "--max-tokens", "64", "--input-len", "4000",
                "--requests", "3", "--quiet", "--out", str(tmp_path / "r.json")]  # fmt: skip
        err = _one_line_error(capsys, main(argv), 2)
        sent = srv.n_requests
    assert "context overflow" in err and "2048" in err and "4000" in err and "64" in err
    assert "--max-model-len" in err and "rejected ignore_eos" not in err
    assert sent == 1  # the run stopped at the first overflow
    model = _tiny_model(tmp_path)
    with SSEServer(Plan(status=400, error_message=msg)) as srv:
        argv = ["doctor", "--url", srv.url, "--model", str(model), "--max-tokens", "8"]
        argv += ["--concurrency", "none", "--no-telemetry", "--no-measure-cpu", "--no-sanity"]
        rc = main([*argv, "--out-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "context overflow" in err, err
    assert json.loads((tmp_path / "o" / "doctor.json").read_text())["verdict"] is None


def test_negative_usage_counts_fail_the_request(tmp_path):
    from ceiling.bench.config import BenchConfig
    from ceiling.bench.runner import run_bench

    with SSEServer(Plan(usage_tokens_offset=-100)) as srv:
        res = run_bench(
            BenchConfig(url=srv.url, max_tokens=4, requests=2, warmup=0), progress=False
        )
    assert res.completed == 0 and res.errors == {"bad_usage": 2}


@pytest.mark.parametrize(
    "field,value", [("mean_tpot_ms", -5.0), ("decode_tok_s_per_stream", 1e309)]
)
def test_compare_refuses_impossible_numbers(field, value, tmp_path, capsys):
    with SSEServer(Plan(itl_s=0.001)) as srv:
        a = tmp_path / "a.json"
        main(["bench", "--url", srv.url, "--max-tokens", "4", "--requests", "2", "--quiet",
              "--out", str(a)])  # fmt: skip
    capsys.readouterr()
    doc = json.loads(a.read_text())
    doc["levels"][0]["repeats"][0][field] = value
    b = tmp_path / "b.json"
    b.write_text(json.dumps(doc).replace("Infinity", "1e309"))
    err = _one_line_error(capsys, main(["compare", str(a), str(b), "--metric", field]), 2)
    assert field in err


def test_a_sweep_whose_every_variant_failed_exits_1(tmp_path, capsys, monkeypatch):
    from ceiling.flows import sweep as sweep_flow
    from ceiling.sweep.schema import SweepResult

    def all_failed(*_a, **_k):
        variants = [{"name": n, "fingerprint": n, "status": "failed", "repeats": 0} for n in "ab"]
        return SweepResult.model_validate(
            {
                "title": "s",
                "plan": "p",
                "ledger": "l",
                "baseline": "a",
                "variants": variants,
                "comparison": [],
                "verdict": {"headline": "every variant failed"},
            }
        )

    monkeypatch.setattr(sweep_flow, "run", all_failed)
    # a valid plan (the CLI reads it before the flow): its variants fail in the flow above
    plan = write_plan(tmp_path, ["a", "b"])
    err = _one_line_error(capsys, main(["sweep", str(plan), "--out-dir", str(tmp_path / "o")]), 1)
    assert "no variant of the sweep was measured" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--url", "http://127.0.0.1:9", "--quiet", "--out", "{L}"],
        ["bench", "--url", "http://127.0.0.1:9", "--quiet", "--dataset", "{L}"],
        ["doctor", "--url", "http://127.0.0.1:9", "--out-dir", "{L}"],
        ["predict", "--model", "{L}", "--gpu", "h200"],
        ["shm", "--root", "{L}"],
        ["probe", "--out", "{L}"],
        ["commbench", "--sizes", "1e309"],  # found by the long fuzz profile: int(inf)
    ],
)
def test_a_name_longer_than_the_filesystem_allows(argv, capsys):
    """Path.exists()/is_file() raise ENAMETOOLONG instead of answering False: a 300-byte name
    was a traceback wherever a path was looked at (found by the fuzz suite)."""
    rc = main([a.replace("{L}", "a" * 300) for a in argv])
    _one_line_error(capsys, rc, 2)
