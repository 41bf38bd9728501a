"""Causes from the server's own answer (issue 38): why requests ended, the served context, the
server's error text in every result, and warnings that name the real cause and its fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ceiling.bench.causes import early_end_warning
from ceiling.bench.client import RawStream
from ceiling.bench.config import BenchConfig
from ceiling.bench.metrics import early_ends, process
from ceiling.bench.runner import run_bench
from ceiling.cli import main
from sse_server import Plan, SSEServer

pytestmark = pytest.mark.timeout(120)

CTX = 512  # llama-server -c 512 --parallel 1: one slot of 512 tokens
LLAMA_PROPS = {"default_generation_settings": {"id": 0, "n_ctx": CTX}, "total_slots": 1}


def _at_context(_i: int, body: dict[str, Any]) -> Plan:
    """llama-server at its context: generation ends with finish_reason length once prompt +
    generated fill the slot, whatever max_tokens asked."""
    prompt = len(str(body.get("prompt", "")).split())
    room = CTX - prompt
    want = int(body["max_tokens"])
    return Plan(ttft_s=0.001, itl_s=0.0, tokens=min(want, room), finish_reason="length")


def _cfg(url: str, **kw: Any) -> BenchConfig:
    base: dict[str, Any] = {"url": url, "input_len": 128, "warmup": 0, "requests": 2}
    base.update(kw)
    return BenchConfig(**base)


def test_length_at_the_served_context_names_the_arithmetic_and_the_fix() -> None:
    with SSEServer(_at_context, props=LLAMA_PROPS) as srv:
        res = run_bench(_cfg(srv.url, max_tokens=1000), progress=False)
    assert res.served_context == CTX and "/props" in (res.served_context_source or "")
    assert res.finish_reasons == {"length": 2}
    [end] = res.early_ends
    assert (end.finish_reason, end.prompt_tokens, end.output_tokens) == ("length", 128, 384)
    said = "\n".join(res.warnings)
    assert "prompt 128 + 384 generated = 512 = the served context" in said
    assert "lower --max-tokens to 384 or less" in said
    assert "--ignore-eos" not in said  # it was on: never the fix


def test_length_without_a_known_context_still_names_length_not_eos() -> None:
    with SSEServer(_at_context) as srv:  # no /props, no max_model_len
        res = run_bench(_cfg(srv.url, max_tokens=1000), progress=False)
    assert res.served_context is None
    said = "\n".join(res.warnings)
    assert "finish_reason length" in said and "prompt 128 + 384 generated = 512" in said
    assert "EOS" not in said and "--ignore-eos" not in said


def test_eos_despite_ignore_eos_says_the_server_ignored_it() -> None:
    plan = Plan(ttft_s=0.001, itl_s=0.0, tokens=5, finish_reason="stop")
    with SSEServer(plan) as srv:
        res = run_bench(_cfg(srv.url, max_tokens=50, input_len=8), progress=False)
    said = "\n".join(res.warnings)
    assert "though ignore_eos was sent" in said and "--logit-bias" in said
    assert "pass --ignore-eos" not in said


def test_default_max_tokens_is_clipped_to_the_served_context_with_a_note() -> None:
    with SSEServer(_at_context, max_model_len=CTX) as srv:  # vLLM says it in /v1/models
        res = run_bench(_cfg(srv.url), progress=False)  # single mode: default 2048
        sent = {b["max_tokens"] for b in srv.bodies}
    assert sent == {CTX - 128}
    assert res.served_context == CTX and res.served_context_source == "/v1/models max_model_len"
    assert res.early_ends == [] and res.finish_reasons == {"length": 2}
    assert any("clipped from the single default 2048 to 384" in w for w in res.warnings)


def test_a_given_max_tokens_is_sent_as_given() -> None:
    with SSEServer(_at_context, max_model_len=CTX) as srv:
        run_bench(_cfg(srv.url, max_tokens=1000), progress=False)
        assert {b["max_tokens"] for b in srv.bodies} == {1000}


def test_the_servers_error_text_is_kept_in_every_result(tmp_path: Path) -> None:
    plan = Plan(error_event_at=0, event_message="Context size has been exceeded.")
    out = tmp_path / "r.json"
    with SSEServer(plan) as srv:
        res = run_bench(_cfg(srv.url, max_tokens=8, requests=3, out=out), progress=False)
    msg = "error event in stream: Context size has been exceeded."
    assert res.errors == {"stream_error": 3} and res.error_messages == {msg: 3}
    saved = json.loads(out.read_text())  # without --save-detailed
    assert saved["requests"] is None
    assert saved["error_messages"] == {msg: 3}
    assert saved["levels"][0]["error_messages"] == {msg: 3}
    assert any("Context size has been exceeded." in w for w in res.warnings)


def test_the_cli_failure_carries_the_servers_message_and_the_context_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = Plan(error_event_at=0, event_message="Context size has been exceeded.")
    with SSEServer(plan) as srv:
        rc = main(["bench", "--url", srv.url, "--requests", "2", "--warmup", "0", "--quiet",
                   "--max-tokens", "8", "--out", str(tmp_path / "r.json")])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 1
    assert "Context size has been exceeded." in err
    assert "read the errors in the result" not in err
    assert "raise the context" in err and "--max-tokens" in err


def test_llama_servers_stop_type_is_recorded_and_limit_reads_as_length() -> None:
    raw = RawStream()
    final = {"content": "", "stop": True, "stop_type": "limit", "choices": []}
    raw.events = [
        (1_000, json.dumps({"choices": [{"text": "a", "finish_reason": None}]}).encode()),
        (2_000, json.dumps(final).encode()),
        (2_001, b"[DONE]"),
    ]
    rec = process(raw, 0, max_tokens=8, prompt_tokens_expected=504)
    assert rec.ok and rec.stop_type == "limit" and rec.finish_reason is None
    [end] = early_ends([rec])
    said = early_end_warning(end, 1, served_context=505, ignore_eos_sent=True)
    assert "stop_type limit" in said and "prompt 504 + 1 generated = 505 = the served" in said
