"""The doctor's one setup (issue 38): what the user states (--model, --gpu, --tp,
--served-model) is checked against what the server and the box show, a contradiction is
refused naming both values before any slow work, what cannot be seen is said to be as given;
the title, the prediction and the bound then describe that one setup. And every Reproduce
line is a command the real CLI parses into the very run it reproduces."""

from __future__ import annotations

import functools
import json
import shlex
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from ceiling.bench.config import BenchConfig
from ceiling.cli import app, main
from ceiling.diagnose.expect import expect
from ceiling.diagnose.facts import EngineFacts
from ceiling.diagnose.schema import DoctorConfig
from ceiling.diagnose.setup import Seen, SeenModel, Stated, report_title, resolve, size_in_name
from ceiling.errors import CeilingError, ExitStatus
from ceiling.flows.doctor_checks import bench_config, reproduce
from ceiling.flows.hardware import describe_hardware, find_model_dir
from ceiling.flows.setup_seen import is_local, seen_of_server, shape_of, stated_setup
from ceiling.predict.api import PredictRequest, predict
from ceiling.server.schema import ServedModel
from ceiling.spec.hardware import GpuHardware, load_gpu
from gpu_box import gpu_box, use_gpu_box
from http_stub import serve
from sse_server import Plan, SSEServer

GGUF = Path(__file__).parent / "fixtures" / "gguf" / "tiny-llama-f16.header.gguf"


def _llama_server(asked: list[str]) -> type[BaseHTTPRequestHandler]:
    """llama-server's plain endpoints, serving the tiny GGUF on the CPU; records every path."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_a: object) -> None:
            pass

        def _json(self, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            asked.append(self.path)
            if self.path == "/v1/models":
                self._json({"data": [{"id": "tiny", "owned_by": "llamacpp"}]})
            elif self.path == "/props":
                self._json({"model_path": str(GGUF), "total_slots": 1})
            else:
                self._json({"status": "ok"})

        def do_POST(self) -> None:
            asked.append(self.path)
            self.send_response(500)
            self.end_headers()

    return Handler


def test_the_issues_example_is_refused_naming_both_before_any_slow_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A llama-server on this GPU-less box serving a tiny GGUF, examined as "llama-3.1-70b on
    4 x h100-sxm": it exited 0 with a report "tiny on h100-sxm" and a bound of 1.9 M tok/s."""
    use_gpu_box(monkeypatch, gpu_box(0))
    asked: list[str] = []
    with serve(_llama_server(asked)) as url:
        base = ["doctor", "--url", url, "--no-sanity", "--concurrency", "none", "--quiet"]
        out = tmp_path / "o1"
        argv = [*base, "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "4"]
        assert main([*argv, "--out-dir", str(out)]) == ExitStatus.INPUT
        err = capsys.readouterr().err
        assert "--model llama-3.1-70b (80 layers, hidden 8192" in err
        assert f"{GGUF} (4 layers, hidden 256) (its /props)" in err
        assert "fix:" in err and "drop --model" in err
        doc = json.loads((out / "doctor.json").read_text())
        stages = {s["name"]: s["status"] for s in doc["stages"]}
        assert stages["setup"] == "failed"
        assert not {"sanity", "hardware", "predict", "bench single"} & set(stages)
        # the model left out: the GPU is what contradicts the box
        out = tmp_path / "o2"
        assert main([*base, "--gpu", "h100-sxm", "--tp", "4", "--out-dir", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--gpu h100-sxm, but the server at {url} runs on this box, which has no GPU" in err
        assert "drop --gpu" in err
        # an alias of the served model's catalog entry is no contradiction, neither is a size
        # the served names agree with; only nothing measured was asked of the server
    assert all(p in ("/v1/models", "/props", "/health") for p in asked), asked


def test_a_server_on_another_machine_is_as_given_not_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What cannot be seen is used as given, and the report says so."""
    monkeypatch.setattr("ceiling.flows.setup_seen.is_local", lambda _url: False)
    with SSEServer(Plan(itl_s=0.012, ttft_s=0.01)) as srv:
        cfg = DoctorConfig(url=srv.url, model_path="llama-3.1-8b", gpu="h100", tp=2,
                           max_tokens=8, repeat=1, concurrency=[], out_dir=str(tmp_path),
                           progress=False, sanity=False, telemetry=False)  # fmt: skip
        from ceiling.flows.doctor import run
        from ceiling.report import render

        res = run(cfg, report=render)
    notes = [a for a in res.assumptions if "not seen" in a]
    assert any(n.startswith("model llama-3.1-8b: as given (--model), not seen") for n in notes)
    assert any(n.startswith("GPU h100-sxm: as given (--gpu), not seen") for n in notes)
    assert any(n.startswith("TP 2: as given (--tp), not seen") for n in notes)
    assert res.title == "ceiling doctor — synthetic on 2 x h100-sxm"
    assert res.prediction is not None and res.prediction.request.tp == 2
    md = (tmp_path / "report.md").read_text()
    assert "GPU h100-sxm: as given (--gpu), not seen" in md


def test_loopback_is_this_box() -> None:
    assert is_local("http://127.0.0.1:8000") and is_local("http://localhost:1")
    assert is_local("http://[::1]:8000") and is_local("http://127.0.1.1:8000")
    assert not is_local("http://10.0.0.5:8000") and not is_local("http://gpu-box:8000")


def test_names_tell_sizes_apart_and_aliases_tell_nothing() -> None:
    assert size_in_name("meta-llama/Llama-3.1-70B-Instruct") == "70.0"
    assert size_in_name("Qwen/Qwen3-30B-A3B") == "30.0" and size_in_name("qwen2.5-0.5b") == "0.5"
    assert size_in_name("prod") is None and size_in_name("kimi-k2.5") is None
    # a catalog name against an HF id of the same model: the same; against another: refused
    seen = Seen(local=False, url="http://h:1",
                models=[SeenModel(name="meta-llama/Llama-3.1-70B-Instruct", where="root")])  # fmt: skip
    assert resolve(Stated(model="llama-3.1-70b", shape=shape_of("llama-3.1-70b")), seen)
    with pytest.raises(CeilingError, match=r"--model llama-3\.1-8b \(8B\).*Llama-3\.1-70B"):
        resolve(Stated(model="llama-3.1-8b", shape=shape_of("llama-3.1-8b")), seen)


def test_served_model_and_tp_are_checked_against_the_server() -> None:
    seen = Seen(local=False, url="http://h:1", served_ids=["a", "b"], tp=8,
                tp_where="the start-up log")  # fmt: skip
    with pytest.raises(CeilingError, match="--served-model 'c', but http://h:1 serves 'a', 'b'"):
        resolve(Stated(served_model="c"), seen)
    assert resolve(Stated(served_model="b"), seen).served == "b"
    with pytest.raises(
        CeilingError, match="--tp 4, but the start-up log says tensor-parallel size 8"
    ):
        resolve(Stated(tp=4), seen)
    assert resolve(Stated(), seen).tp == 8
    box = Seen(local=True, box_gpus=["NVIDIA H200"] * 2, box_catalog=["h200"] * 2)
    with pytest.raises(CeilingError, match="--tp 4, but the server runs on this box, which has 2"):
        resolve(Stated(tp=4), box)
    with pytest.raises(CeilingError, match=r"--gpu h100-sxm, .* 2 x NVIDIA H200 \(h200\)"):
        resolve(Stated(gpu="h100-sxm"), box)
    cpu_log = Seen(local=False, device="cpu")
    with pytest.raises(
        CeilingError, match="--gpu h200, but the server's start-up log says it runs on the CPU"
    ):
        resolve(Stated(gpu="h200"), cpu_log)


def test_every_refusal_names_only_options_the_doctor_has() -> None:
    """A fix that says "drop --gpu" must name an option `ceiling doctor` takes."""
    doctor = typer.main.get_command(app).commands["doctor"]  # type: ignore[attr-defined]
    options = {o for p in doctor.params for o in (*p.opts, *p.secondary_opts)}
    cases = [
        (Stated(served_model="c"), Seen(local=False, served_ids=["a"])),
        (Stated(tp=4), Seen(local=False, tp=8, tp_where="the log")),
        (Stated(tp=4), Seen(local=True, box_gpus=["x"], box_catalog=["h200"])),
        (Stated(gpu="h200"), Seen(local=True, box_gpus=[])),
        (Stated(gpu="h200"), Seen(local=True, box_gpus=["x"], box_catalog=["b200"])),
        (Stated(gpu="h200"), Seen(local=False, device="cpu")),
        (Stated(model="llama-3.1-8b"), Seen(local=False, models=[SeenModel(name="x-70b", where="w")])),
    ]  # fmt: skip
    for stated, seen in cases:
        with pytest.raises(CeilingError) as exc:
            resolve(stated, seen)
        named = {w.strip(",.()") for w in f"{exc.value.message} {exc.value.fix}".split()}
        assert {w for w in named if w.startswith("--")} <= options, exc.value


# ---- the Reproduce lines --------------------------------------------------------------------


class _Captured(Exception):
    pass


def _parsed_doctor(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> DoctorConfig:
    """The DoctorConfig the real CLI builds from ``argv`` (the flow itself does not run)."""
    got: list[DoctorConfig] = []

    def fake_run(cfg: DoctorConfig, report: object = None) -> None:
        got.append(cfg)
        raise _Captured

    monkeypatch.setattr("ceiling.flows.doctor.run", fake_run)
    with pytest.raises(_Captured):
        typer.main.get_command(app).main(argv, standalone_mode=False)
    return got[0]


def _parsed_bench(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> BenchConfig:
    got: list[BenchConfig] = []

    def fake_run(cfg: BenchConfig, progress: bool = True) -> None:
        got.append(cfg)
        raise _Captured

    monkeypatch.setattr("ceiling.bench.runner.run_bench", fake_run)
    with pytest.raises(_Captured):
        typer.main.get_command(app).main(argv, standalone_mode=False)
    return got[0]


def test_reproduce_lines_are_the_run_they_reproduce(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's Reproduce line dropped --gpu, --tp and --no-sanity. Every option that shapes
    the run is carried: the real CLI parses each line into the same configuration."""
    (tmp_path / "lb.json").write_text("[]")
    (tmp_path / "prof.json").write_text("{}")
    given = ["doctor", "--url", "http://127.0.0.1:18123", "--model", "llama-3.1-70b",
             "--served-model", "my model", "--engine", "vllm", "--gpu", "h100-sxm", "--tp", "4",
             "--no-cuda-graphs", "--max-tokens", "100", "--input-len", "32", "--repeat", "5",
             "--concurrency", "1,8", "--concurrency-max-tokens", "64", "--target", "55.5",
             "--no-telemetry", "--no-measure-cpu", "--ready-timeout", "99", "--no-sanity",
             "--trace", "--trace-steps", "8", "--max-failed-pct", "1.5", "--stall-timeout", "7",
             "--llama-bench", str(tmp_path / "lb.json"), "--profile",
             str(tmp_path / "prof.json"), "--out-dir", str(tmp_path / "out dir")]  # fmt: skip
    cfg = _parsed_doctor(given, monkeypatch)
    lines = reproduce(cfg, "http://127.0.0.1:18123", "my model")
    assert len(lines) == 3 and all(line.startswith("ceiling ") for line in lines)
    again = _parsed_doctor(shlex.split(lines[0])[1:], monkeypatch)
    assert again == cfg
    for line, mode in zip(lines[1:], ("single", "concurrency"), strict=True):
        bench = _parsed_bench(shlex.split(line)[1:], monkeypatch)
        want = bench_config(cfg, "http://127.0.0.1:18123", "my model", mode, None)
        assert bench.model_dump(exclude={"out"}) == want.model_dump(exclude={"out"})
    # the defaults: the line is short, and still the same run
    plain = _parsed_doctor(["doctor", "--url", "http://h:1"], monkeypatch)
    [line, single] = reproduce(plain.model_copy(update={"concurrency": []}), "http://h:1", None)
    assert _parsed_doctor(shlex.split(line)[1:], monkeypatch).concurrency == []
    assert "--served-model" not in single
    v = tmp_path / "v.yaml"
    v.write_text("engine: vllm\nmodel: /m\n")
    launched = _parsed_doctor(["doctor", "--variant", str(v), "--no-sanity"], monkeypatch)
    pre, line, *_ = reproduce(launched, "http://127.0.0.1:8000", "m")
    assert shlex.split(pre) == ["ceiling", "preflight", str(v)]
    assert _parsed_doctor(shlex.split(line)[1:], monkeypatch) == launched


# ---- the property: one setup per report -----------------------------------------------------

MODELS = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-70b-fp8", "llama-3.3-70b", "qwen3-32b",
          "qwen2.5-7b"]  # fmt: skip
#: how a server may name what it serves: the catalog's HF id (a root) or an alias (an id)
HF = {"llama-3.1-8b": "meta-llama/Llama-3.1-8B", "llama-3.3-70b": "meta-llama/Llama-3.3-70B-Instruct",
      "qwen3-32b": "Qwen/Qwen3-32B", "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
      "llama-3.1-70b-fp8": "nvidia/Llama-3.1-70B-Instruct-FP8"}  # fmt: skip
GPUS = ["h100-sxm", "h200", "a100-80"]
ALIASES = {"h100": "h100-sxm", "a100-sxm": "a100-80", "h200-sxm": "h200"}
RAW = {
    "h100-sxm": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200",
    "a100-80": "NVIDIA A100-SXM4-80GB",
}
BOX = 8


@functools.cache
def _fits(model: str, gpu: str | None, tp: int) -> bool:
    """Whether the served world is one a server can run (predict answers for it)."""
    try:
        hw = GpuHardware(name=gpu, gpus=tp, description="x") if gpu else None
        predict(PredictRequest(model=model, hardware=hw, tp=tp, gpus=tp, batch=1, context=64)
                if hw else PredictRequest(model=model, gpu="h200", batch=1, context=64))  # fmt: skip
    except CeilingError:
        return False
    return True


served_worlds = st.tuples(
    st.sampled_from(MODELS),
    st.sampled_from([*GPUS, None]),
    st.sampled_from([1, 2, 4, 8]),
    st.booleans(),  # the server names its model by the HF id it loaded (else: an alias only)
).filter(lambda w: (w[1] is not None or w[2] == 1) and _fits(w[0], w[1], w[2]))
stated_setups = st.tuples(
    st.sampled_from([*MODELS, None]),
    st.sampled_from([*GPUS, *ALIASES, None]),
    st.sampled_from([1, 2, 4, 8, None]),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
          HealthCheck.filter_too_much])  # fmt: skip
@given(served=served_worlds, stated=stated_setups)
# found by CI: a server that names its model by an HF id the catalog has none for is an alias
@example(served=("llama-3.1-70b", "h100-sxm", 2, True), stated=(None, "h100-sxm", 2))
def test_the_doctor_refuses_or_describes_the_served_setup(
    served: tuple[str, str | None, int, bool],
    stated: tuple[str | None, str | None, int | None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """For a served (model, GPU, TP) on this box and a stated one: refused naming both
    values, or a setup whose title, prediction and bound all describe the served one."""
    s_model, s_gpu, s_tp, named = served
    u_model, u_gpu, u_tp = stated
    use_gpu_box(monkeypatch, gpu_box(BOX, RAW[s_gpu], s_gpu) if s_gpu else gpu_box(0))
    url = "http://127.0.0.1:8000"
    root = HF.get(s_model) if named else None
    models = [ServedModel(id="prod", root=root, owned_by="vllm")]
    facts = EngineFacts(engine="vllm", tensor_parallel_size=s_tp,
                        device="cuda" if s_gpu else "cpu")  # fmt: skip
    cfg = DoctorConfig(url=url, model_path=u_model, gpu=u_gpu, tp=u_tp, measure_cpu=False,
                       progress=False)  # fmt: skip
    seen = seen_of_server(url, models, "prod", "vllm", facts)
    try:
        setup = resolve(stated_setup(cfg), seen)
    except CeilingError as exc:
        text = exc.message
        pairs = []
        if u_tp is not None and u_tp != s_tp:
            pairs.append((f"--tp {u_tp}", f"size {s_tp}"))
        if u_gpu is not None and load_gpu(u_gpu).name != s_gpu:
            want = f"{RAW[s_gpu]} ({s_gpu})" if s_gpu else "runs on the CPU"
            pairs.append((f"--gpu {load_gpu(u_gpu).name}", want))
        ours, theirs = shape_of(u_model), shape_of(s_model)
        if ours is not None and theirs is not None and not ours.same_as(theirs) and root:
            pairs.append((f"--model {u_model}", root))
        assert any(a in text and b in text for a, b in pairs), (text, pairs)
        event("refused")
        return
    eff = cfg.model_copy(update={"tp": setup.tp, "gpu": setup.gpu})
    hardware = describe_hardware(eff)[0]
    model = find_model_dir(eff, None, models)
    if model is None:  # an alias only, and no --model: the doctor says it cannot find it
        assert root is None and u_model is None  # no HF id known for it: an alias only
        return
    if not root:  # the served model is not seen: the user's is predicted, said as given
        assert any("as given (--model), not seen" in n for n in setup.notes)
        s_model = model
    if not _fits(model, s_gpu, s_tp):
        return  # the stated model of the served shape does not fit: predict says so itself
    exp = expect(eff, hardware, model, setup.served, facts, None)
    pred = exp.prediction
    shape = shape_of(s_model)
    assert shape is not None
    assert (pred.model.layers, pred.model.hidden_size) == (shape.layers, shape.hidden)
    if u_model is not None and root:  # the served weights seen: the predicted ones are those
        assert shape_of(model) is not None and shape_of(model).same_as(shape)  # type: ignore[union-attr]
    if s_gpu is None:
        assert hardware.kind == "cpu" and pred.kind == "cpu-floors"
    else:
        assert isinstance(hardware, GpuHardware) and hardware.name == s_gpu
        assert pred.request.tp == s_tp and pred.deployment.tp == s_tp
        assert pred.bound_tok_s is not None and pred.request.hardware == hardware
    event("described")
    title = report_title(setup.served, hardware, eff.tp)
    assert title.startswith("ceiling doctor — prod on ")
    assert title.endswith(hardware.name) and (s_gpu is None or s_gpu in title)
    assert s_gpu is None or s_tp == 1 or f"{s_tp} x {s_gpu}" in title
