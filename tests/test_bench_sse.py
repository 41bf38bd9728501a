"""SSE splitting and per-request metric extraction, on hand-made byte streams."""

from __future__ import annotations

import json

import pytest

from ceiling.bench.client import RawStream
from ceiling.bench.metrics import RequestRecord, process, steady_state
from ceiling.bench.sse import SSESplitter


def test_splitter_handles_partial_reads_crlf_comments_and_multiline() -> None:
    sp = SSESplitter()
    assert sp.feed(b'data: {"a"') == []
    assert sp.feed(b": 1}\n\n") == [(b'{"a": 1}', 16)]
    got = sp.feed(b": keep-alive\n\ndata: x\r\n\r\ndata:y\n\n")
    assert got == [(b"x", 16 + 14 + 11), (b"y", 16 + 14 + 11 + 8)]
    assert sp.feed(b"event: message\ndata: line1\ndata: line2\n\n")[0][0] == b"line1\nline2"
    assert [p for p, _ in sp.feed(b"data: [DONE]\n\ndata: tail")] == [b"[DONE]"]
    assert sp.leftover() == b"data: tail"


def test_splitter_offsets_point_just_past_each_event() -> None:
    stream = b"data: a\n\ndata: bb\r\n\r\n: c\n\ndata: ccc\n\n"
    sp = SSESplitter()
    events = [e for i in range(len(stream)) for e in sp.feed(stream[i : i + 1])]
    assert [p for p, _ in events] == [b"a", b"bb", b"ccc"]
    for payload, end in events:
        assert stream[:end].endswith((b"\n\n", b"\r\n\r\n")) and payload in stream[:end]


def _chunk(
    text: str | None = None,
    *,
    finish: str | None = None,
    usage: int | None = None,
    chat: bool = False,
    reasoning: str | None = None,
    ids: list[int] | None = None,
) -> bytes:
    if usage is not None:
        return json.dumps(
            {"choices": [], "usage": {"completion_tokens": usage, "prompt_tokens": 7}}
        ).encode()
    if chat:
        delta = {}
        if text is not None:
            delta["content"] = text
        if reasoning is not None:
            delta["reasoning_content"] = reasoning
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    return json.dumps({"choices": [choice]}).encode()


def _raw(events: list[tuple[float, bytes]], status: int = 200) -> RawStream:
    raw = RawStream()
    raw.t_send_ns = 1_000_000_000
    raw.status = status
    raw.events = [(raw.t_send_ns + int(ms * 1e6), p) for ms, p in events]
    return raw


def test_tpot_ttft_itl_from_timestamps_and_usage() -> None:
    # TTFT 50 ms, then 9 more tokens 10 ms apart; usage says 10.
    ev = [(50.0 + 10 * i, _chunk("t")) for i in range(10)]
    ev += [(140.5, _chunk("", finish="length")), (141.0, _chunk(usage=10)), (141.2, b"[DONE]")]
    rec = process(_raw(ev), 0, max_tokens=10)
    assert rec.ok and not rec.short
    assert rec.ttft_ms == pytest.approx(50.0)
    assert rec.e2el_ms == pytest.approx(140.0)
    assert rec.tpot_ms == pytest.approx(10.0)
    assert rec.decode_tok_s == pytest.approx(100.0)
    assert rec.itl_ms == pytest.approx([10.0] * 9)
    assert rec.output_tokens == 10 and rec.output_tokens_source == "usage"
    assert rec.prompt_tokens == 7 and not rec.usage_mismatch
    assert rec.finish_reason == "length"


def test_multi_token_chunks_use_usage_and_report_mismatch() -> None:
    ev = [(20.0 + 10 * i, _chunk("abc")) for i in range(5)]
    ev += [(61.0, _chunk(finish="length")), (62.0, _chunk(usage=20)), (62.0, b"[DONE]")]
    rec = process(_raw(ev), 0, max_tokens=20)
    assert rec.output_tokens == 20 and rec.chunks == 5 and rec.usage_mismatch
    assert rec.tpot_ms == pytest.approx(40.0 / 19)


def test_token_ids_count_when_usage_is_absent() -> None:
    ev = [
        (10.0, _chunk("ab", ids=[1, 2])),
        (20.0, _chunk("c", ids=[3], finish="length")),
        (21.0, b"[DONE]"),
    ]
    rec = process(_raw(ev), 0, max_tokens=3)
    assert rec.output_tokens == 3 and rec.output_tokens_source == "token_ids"
    assert rec.chunk_tokens == [2, 1]


def test_reasoning_counts_as_output_and_ttfct_is_later() -> None:
    ev = [(1.0, _chunk("", chat=True))]  # role chunk with empty content: not a token
    ev += [(10.0 + i, _chunk(chat=True, reasoning="r")) for i in range(3)]
    ev += [(20.0 + i, _chunk("c", chat=True)) for i in range(3)]
    ev += [(30.0, _chunk(chat=True, finish="length")), (30.0, b"[DONE]")]
    rec = process(_raw(ev), 0, max_tokens=6)
    assert rec.ok
    assert rec.ttft_ms == pytest.approx(10.0)
    assert rec.ttfct_ms == pytest.approx(20.0)
    assert rec.output_tokens == 6 and rec.reasoning_chunks == 3


def test_error_event_malformed_and_incomplete_streams() -> None:
    err = json.dumps({"error": {"message": "engine dead", "code": 500}}).encode()
    rec = process(_raw([(5.0, _chunk("a")), (6.0, err), (7.0, b"[DONE]")]), 0, max_tokens=4)
    assert not rec.ok and rec.error_kind == "stream_error" and "engine dead" in (rec.error or "")
    bad = process(
        _raw([(5.0, b"{nope"), (6.0, _chunk("a", finish="length")), (7.0, b"[DONE]")]),
        1,
        max_tokens=1,
    )
    assert bad.ok and bad.malformed_chunks == 1
    only_bad = process(_raw([(5.0, b"{nope")]), 2, max_tokens=1)
    assert only_bad.error_kind == "malformed_sse"
    cut = process(_raw([(5.0, _chunk("a")), (6.0, _chunk("b"))]), 3, max_tokens=8)
    assert cut.error_kind == "incomplete" and not cut.ok


def test_short_request_is_flagged() -> None:
    ev = [(5.0, _chunk("a")), (6.0, _chunk("b", finish="stop")), (6.0, b"[DONE]")]
    rec = process(_raw(ev), 0, max_tokens=64)
    assert rec.ok and rec.short and rec.finish_reason == "stop"


def test_steady_state_counts_only_the_window_with_all_streams_decoding() -> None:
    def rec(send_s: float, chunk_ms: list[float]) -> RequestRecord:
        return RequestRecord(
            index=0,
            t_send_s=send_s,
            ok=True,
            output_tokens=len(chunk_ms),
            chunks=len(chunk_ms),
            chunk_ms=chunk_ms,
        )

    # Stream A decodes 0..100 ms, stream B 50..150 ms, each a token every 1 ms.
    a = rec(0.0, [float(i) for i in range(101)])
    b = rec(0.05, [float(i) for i in range(101)])
    tput, span = steady_state([a, b], level=2)
    assert span == pytest.approx(0.05)
    assert tput == pytest.approx(2000.0, rel=0.05)  # two streams x 1000 tok/s
