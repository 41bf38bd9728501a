"""The benchmark against the synthetic SSE server: numbers, prompts, secrets, faults."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from ceiling.bench.config import BenchConfig
from ceiling.bench.results import load_result
from ceiling.bench.runner import run_bench
from ceiling.errors import CeilingError
from sse_server import Plan, SSEServer

pytestmark = pytest.mark.timeout(120)


def _cfg(url: str, **kw: object) -> BenchConfig:
    base: dict[str, object] = {"url": url, "max_tokens": 16, "input_len": 12, "warmup": 0}
    if "dataset" in kw:  # a dataset brings its own lengths: --input-len beside it is refused
        del base["input_len"]
    base.update(kw)
    return BenchConfig(**base)  # type: ignore[arg-type]


def test_single_mode_numbers_match_the_schedule(tmp_path: Path) -> None:
    with SSEServer(Plan(ttft_s=0.02, itl_s=0.01)) as srv:
        res = run_bench(
            _cfg(srv.url, requests=3, warmup=1, out=tmp_path / "r.json"), progress=False
        )
        assert srv.n_requests == 4  # warm-up + 3
    assert res.completed == 3 and res.failed == 0 and not res.partial
    assert res.model_id == "synthetic" and res.total_output_tokens == 48
    assert res.timestamp_source == "kernel"  # Linux: receive timestamps from the kernel
    # TPOT is the gap the server really left between tokens (its own histogram: a stall of the
    # shared box shifts both), never faster than the 10 ms schedule, and consistent with E2E.
    server_itl = res.server_metrics["quantities"]["itl"]["server_mean_ms"]  # type: ignore[index]
    assert res.mean_tpot_ms == pytest.approx(server_itl, rel=0.05)
    assert res.mean_tpot_ms >= 9.5
    assert res.mean_e2el_ms == pytest.approx(res.mean_ttft_ms + 15 * res.mean_tpot_ms, rel=0.01)
    assert res.decode_tok_s_per_stream == pytest.approx(1000.0 / res.mean_tpot_ms)
    saved = load_result(tmp_path / "r.json")
    assert saved.schema_version == 1 and saved.mean_tpot_ms == res.mean_tpot_ms
    data = json.loads((tmp_path / "r.json").read_text())
    for key in (
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "p99_tpot_ms",
        "mean_itl_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
        "p99_e2el_ms",
    ):
        assert key in data, key


def test_synthetic_prompts_hit_the_length_with_tokenize() -> None:
    with SSEServer(Plan()) as srv:
        res = run_bench(_cfg(srv.url, input_len=37, requests=4), progress=False)
        lengths = [len(b["prompt"].split()) for b in srv.bodies]
        prompts = [b["prompt"] for b in srv.bodies]
    assert res.input_len_source == "tokenize"
    assert lengths == [37] * 4
    assert len(set(prompts)) == 4  # unique: no prefix-cache flattery
    assert res.total_input_tokens == 4 * 37


def test_without_tokenize_lengths_are_approximate_and_said_so() -> None:
    with SSEServer(Plan(), tokenize=False, metrics=False) as srv:
        res = run_bench(_cfg(srv.url, requests=2), progress=False)
    assert res.input_len_source == "approximate"
    assert any("no /tokenize" in w for w in res.warnings)
    assert res.server_metrics is not None and res.server_metrics["available"] is False


def test_request_body_asks_for_usage_and_exact_length() -> None:
    with SSEServer(Plan()) as srv:
        run_bench(_cfg(srv.url, requests=1, max_tokens=9), progress=False)
        body = srv.bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 9 and body["ignore_eos"] is True and body["min_tokens"] == 9
    assert body["model"] == "synthetic"


def test_api_key_is_sent_but_never_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-test-do-not-leak-4242"
    monkeypatch.setenv("CEILING_API_KEY", secret)
    plan = lambda i, _b: Plan(status=401 if i == 1 else 200)  # noqa: E731
    with SSEServer(plan) as srv:
        out = tmp_path / "r.json"
        res = run_bench(_cfg(srv.url, requests=3, save_detailed=True, out=out), progress=False)
        auth = srv.headers[0].get("Authorization")
    assert auth == f"Bearer {secret}"
    assert res.errors.get("http_4xx") == 1
    assert secret not in out.read_text()
    assert secret not in res.model_dump_json()


def test_concurrency_sweep_levels_and_server_metrics() -> None:
    with SSEServer(Plan(ttft_s=0.01, itl_s=0.005)) as srv:
        res = run_bench(
            _cfg(srv.url, mode="concurrency", concurrency=[1, 4], requests=8, repeat=2),
            progress=False,
        )
    assert [lv.concurrency for lv in res.levels] == [1, 4]
    for lv in res.levels:
        assert lv.completed == 16 and len(lv.repeats) == 2
        ci = lv.ci["decode_tok_s_per_stream"]
        assert ci.n == 2 and ci.low is not None and ci.low <= ci.mean <= ci.high
    c4 = res.level(4)
    assert c4 is not None and c4.steady_state_output_throughput is not None
    # While all four streams decode, the output rate is about four streams' worth.
    ratio = c4.steady_state_output_throughput / c4.decode_tok_s_per_stream
    assert 3.0 < ratio < 4.6
    sm = res.levels[0].server_metrics  # per level: a multi-level run has none at the top
    assert sm is not None and sm["available"] and sm["engine"] == "vllm"
    itl = sm["quantities"]["itl"]
    assert itl["client_mean_ms"] == pytest.approx(itl["server_mean_ms"], rel=0.1)
    assert sm["quantities"]["ttft"]["overhead_ms"] > -1.0


def test_a_failed_metrics_scrape_is_asked_again() -> None:
    # every other /metrics GET answers 503 (a busy API server): each scrape's second try gets it,
    # so every level keeps the engine's counters (one lost scrape would cost a whole level them)
    with SSEServer(Plan(ttft_s=0.01, itl_s=0.002), metrics_flaky=True) as srv:
        res = run_bench(
            _cfg(srv.url, mode="concurrency", concurrency=[1, 2], requests=4, repeat=2),
            progress=False,
        )
        asked = srv.metrics_requests
    for lv in res.levels:
        sm = lv.server_metrics
        assert sm is not None and sm["available"], sm
        assert sm["quantities"]["itl"]["server_mean_ms"] is not None
    assert asked >= 2 * 2 * 2 * 2  # two scrapes per level and repeat, each asked twice


def test_rate_mode_bounded_by_requests_and_by_duration() -> None:
    with SSEServer(Plan(itl_s=0.001)) as srv:
        res = run_bench(_cfg(srv.url, mode="rate", rate=50.0, requests=12), progress=False)
        assert res.completed == 12 and res.levels[0].request_rate == 50.0
        res2 = run_bench(_cfg(srv.url, mode="rate", rate=20.0, duration=0.5), progress=False)
    assert 2 <= res2.completed <= 30


def test_chat_reasoning_and_multi_token_chunks() -> None:
    with SSEServer(Plan(reasoning_tokens=4, tokens_per_chunk=2, ttft_s=0.005, itl_s=0.01)) as srv:
        res = run_bench(_cfg(srv.url, chat=True, requests=2, max_tokens=12), progress=False)
        assert "messages" in srv.bodies[0]
    assert res.endpoint == "/v1/chat/completions"
    assert res.total_output_tokens == 24
    extra = res.model_extra or {}
    assert extra["tokens_per_chunk"] == pytest.approx(2.0)
    assert extra["mean_ttfct_ms"] > res.mean_ttft_ms + 15  # two reasoning chunks first
    assert any("tokens per chunk" in w for w in res.warnings)


def test_missing_usage_falls_back_to_chunks_and_short_requests_are_flagged() -> None:
    with SSEServer(Plan(usage=False, tokens=5, finish_reason="stop")) as srv:
        res = run_bench(_cfg(srv.url, requests=2, max_tokens=16), progress=False)
    assert res.completed == 2 and res.total_output_tokens == 10
    extra = res.model_extra or {}
    assert extra["short_requests"] == 2 and extra["usage_missing"] == 2
    assert any("ended before max_tokens" in w for w in res.warnings)
    assert any("no usage chunk" in w for w in res.warnings)


def test_faults_are_counted_by_kind_and_the_run_goes_on() -> None:
    plans = {
        0: Plan(status=500),
        1: Plan(status=429),
        2: Plan(malformed_at={3}),
        3: Plan(drop_at=4),
        4: Plan(stall_at=2, stall_s=3.0),
        5: Plan(error_event_at=2),
        6: Plan(done=False, finish_reason="length"),
    }
    with SSEServer(lambda i, _b: plans.get(i, Plan())) as srv:
        res = run_bench(
            _cfg(srv.url, requests=10, stall_timeout=1.0, save_detailed=True), progress=False
        )
    assert not res.partial
    assert res.errors == {
        "connection": 1,
        "http_4xx": 1,
        "http_5xx": 1,
        "malformed_sse_chunks": 1,
        "stream_error": 1,
        "timeout": 1,
    }
    assert res.failed == 5 and res.completed == 5
    assert res.requests is not None and len(res.requests) == 10
    kinds = {r.index: r.error_kind for r in res.requests}
    assert kinds[0] == "http_5xx" and kinds[4] == "timeout" and kinds[6] is None


def test_unreachable_and_wrong_path_fail_fast() -> None:
    t0 = time.monotonic()
    with pytest.raises(CeilingError, match="cannot reach"):
        run_bench(_cfg("http://127.0.0.1:9"), progress=False)
    assert time.monotonic() - t0 < 5.0
    # A blackholed address (TEST-NET-1) must also fail within 5 s.
    t0 = time.monotonic()
    with pytest.raises(CeilingError):
        run_bench(_cfg("http://192.0.2.1:8000"), progress=False)
    assert time.monotonic() - t0 < 5.0
    with SSEServer(Plan()) as srv, pytest.raises(CeilingError, match="404"):
        run_bench(_cfg(srv.url + "/not/here"), progress=False)


def test_dying_server_gives_a_partial_result_on_disk(tmp_path: Path) -> None:
    out = tmp_path / "partial.json"
    with SSEServer(lambda i, _b: Plan(die=i == 4, itl_s=0.001)) as srv:
        res = run_bench(_cfg(srv.url, requests=50, out=out), progress=False)
    assert res.partial and "stopped answering" in (res.partial_reason or "")
    assert res.completed == 4
    saved = load_result(out)
    assert saved.partial and saved.completed == 4


def test_ctrl_c_writes_what_was_measured(tmp_path: Path) -> None:
    out = tmp_path / "int.json"
    with SSEServer(Plan(itl_s=0.002)) as srv:

        def interrupt() -> None:
            # Once a few requests went out (prompt generation takes longer on a busy box).
            deadline = time.monotonic() + 60
            while srv.n_requests < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            os.kill(os.getpid(), signal.SIGINT)

        timer = threading.Thread(target=interrupt, daemon=True)
        timer.start()
        res = run_bench(_cfg(srv.url, requests=500, max_tokens=50, out=out), progress=False)
        timer.join(5)
    assert res.partial and res.partial_reason == "interrupted (Ctrl-C)"
    assert res.completed >= 1
    assert load_result(out).partial


def test_telemetry_absent_is_recorded_not_fatal() -> None:
    with SSEServer(Plan()) as srv:
        res = run_bench(_cfg(srv.url, requests=1, telemetry=True), progress=False)
    assert res.completed == 1
    assert res.telemetry is not None and res.telemetry["available"] in (True, False)
    if not res.telemetry["available"]:
        assert res.telemetry["reason"]


def test_jsonl_dataset_prompts_and_per_prompt_lengths(tmp_path: Path) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        '{"prompt": "one two three", "max_tokens": 5}\n\n'
        '{"messages": [{"role": "user", "content": "hi"}], "output_len": 7}\n'
    )
    with SSEServer(Plan()) as srv:
        res = run_bench(_cfg(srv.url, dataset=data, chat=True, requests=2), progress=False)
        bodies = srv.bodies
    assert res.input_len_source == "dataset" and res.completed == 2
    assert bodies[0]["messages"] == [{"role": "user", "content": "one two three"}]
    assert bodies[0]["max_tokens"] == 5 and bodies[1]["max_tokens"] == 7
    assert bodies[1]["messages"][0]["content"] == "hi"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt key"}\n')
    with SSEServer(Plan()) as srv, pytest.raises(CeilingError, match=r"bad\.jsonl:1"):
        run_bench(_cfg(srv.url, dataset=bad), progress=False)
    with pytest.raises(CeilingError, match="not found"):
        _cfg("http://127.0.0.1:9", dataset=tmp_path / "missing.jsonl")


def test_burst_delivery_is_flagged() -> None:
    # A starved frontend flushes its backlog at once: here the server writes all chunks back to
    # back (no gap), each its own SSE event, so most arrive in the same socket read.
    with SSEServer(Plan(itl_s=0.0, ttft_s=0.01)) as srv:
        res = run_bench(_cfg(srv.url, requests=2, max_tokens=64), progress=False)
    extra = res.model_extra or {}
    assert extra["burst_chunk_share"] is not None and extra["burst_chunk_share"] > 0.2
    assert any("delivered in bursts" in w for w in res.warnings)
    with SSEServer(Plan(itl_s=0.01)) as srv:
        calm = run_bench(_cfg(srv.url, requests=1, max_tokens=16), progress=False)
    assert (calm.model_extra or {})["burst_chunk_share"] < 0.2
    assert not any("delivered in bursts" in w for w in calm.warnings)


def test_server_without_ignore_eos_extension_gets_plain_requests() -> None:
    def strict(_i: int, body: dict) -> Plan:
        if "ignore_eos" in body or "min_tokens" in body:
            return Plan(status=400, error_message="Unrecognized request argument: ignore_eos")
        return Plan(tokens=6, finish_reason="stop")

    with SSEServer(strict) as srv:
        res = run_bench(_cfg(srv.url, requests=2, warmup=1, max_tokens=8), progress=False)
        bodies = srv.bodies
    assert res.completed == 2 and res.failed == 0
    assert "ignore_eos" not in bodies[-1] and "min_tokens" not in bodies[-1]
    assert any("rejected ignore_eos" in w for w in res.warnings)
    assert any("ended before max_tokens" in w for w in res.warnings)


def test_concurrency_bounded_by_duration_and_steady_state_window() -> None:
    with SSEServer(Plan(itl_s=0.002, ttft_s=0.002)) as srv:
        res = run_bench(
            _cfg(srv.url, mode="concurrency", concurrency=[2], duration=0.6, max_tokens=20),
            progress=False,
        )
    lv = res.levels[0]
    assert lv.completed >= 4 and lv.failed == 0
    # Sending stops at the deadline; in-flight requests finish, so the level ends soon after.
    assert 0.55 < lv.duration < 2.0
    extra = lv.model_extra or {}
    assert 0 < extra["steady_state_duration"] <= lv.duration
