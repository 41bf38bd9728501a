"""The doctor's predict stage on a llama.cpp target: routed through predict --engine llamacpp
with the GGUF the server serves (never predicted as vLLM bf16), the configuration mapped from
the options, the log and the variant, a CPU said plainly to have floors only.

GGUF headers: tests/fixtures/gguf (experiments/gpu/random_gguf.py --header-only)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from ceiling.diagnose.expect import GgufFile, expect, gguf_request, serves_gguf
from ceiling.diagnose.facts import EngineFacts
from ceiling.diagnose.schema import DoctorConfig, DoctorResult, Target
from ceiling.engines.variant import Arg, Variant
from ceiling.flows.doctor import _predict_stage, _Recorder
from ceiling.flows.hardware import find_gguf, target_gguf
from ceiling.flows.target import engine_of, server_props
from ceiling.predict.gguf import read_gguf
from ceiling.predict.llamacpp import weights_read
from ceiling.predict.llamacpp_cpu import NO_CPU_MODEL
from ceiling.predict.llamacpp_files import predict_gguf
from ceiling.server.schema import ServedModel
from ceiling.spec.hardware import CpuHardware, GpuHardware, load_gpu
from http_stub import serve

FIX = Path(__file__).parent / "fixtures" / "gguf"
DENSE = FIX / "tiny-llama-f16.header.gguf"
MOE = FIX / "tiny-moe-q4_k_m.header.gguf"
H200 = GpuHardware(name="h200", gpus=1, description="1 x H200")
CPU = CpuHardware(name="test CPU", cores=2, mem_bw_GBps=10.0, gflops=20.0, measured=False,
                  source="assumed for the test")  # fmt: skip


def _cfg(**kw: object) -> DoctorConfig:
    return DoctorConfig(url="http://127.0.0.1:9", **kw)


def _variant(*args: Arg, env: dict[str, str] | None = None, model: str = str(DENSE)) -> Variant:
    return Variant(name="v", engine="llamacpp", model=model, args=list(args), env=env or {})


def test_a_llamacpp_target_is_told_by_its_engine_or_its_log() -> None:
    assert serves_gguf("llamacpp", None) and serves_gguf("llamacpp-python", None)
    assert serves_gguf(None, EngineFacts(engine="llamacpp"))
    assert serves_gguf("me", EngineFacts(engine="llamacpp-python"))  # owned_by says nothing
    assert not serves_gguf("vllm", EngineFacts(engine="vllm")) and not serves_gguf(None, None)


def test_owned_by_names_an_engine_only_when_ceiling_knows_it() -> None:
    assert engine_of(ServedModel(id="m", owned_by="llamacpp")) == "llamacpp"  # llama-server
    assert engine_of(ServedModel(id="m", owned_by="vllm")) == "vllm"
    assert engine_of(ServedModel(id="m", owned_by="me")) is None  # llama-cpp-python's server
    assert engine_of(ServedModel(id="m")) is None


def test_graphs_and_flash_attention_come_from_options_log_then_variant() -> None:
    cfg = _cfg(profile="p.json")
    req = gguf_request(cfg, H200, str(DENSE), None, None)
    assert (req.engine, req.model, req.batch) == ("llamacpp", str(DENSE), 1)
    assert req.cuda_graphs and req.flash_attention is None  # llama.cpp's defaults: on / auto
    assert req.context == cfg.single_context and req.profile == "p.json"
    eager = EngineFacts(engine="llamacpp", enforce_eager=True, flash_attention=False)
    req = gguf_request(cfg, H200, str(DENSE), eager, None)
    assert not req.cuda_graphs and req.flash_attention is False
    # the options win over the log
    assert gguf_request(_cfg(cuda_graphs=True), H200, str(DENSE), eager, None).cuda_graphs
    # no log: the variant's env and flags (GGML_CUDA_DISABLE_GRAPHS set at all = off)
    v = _variant(Arg(flag="--flash-attn", values=["off"]), env={"GGML_CUDA_DISABLE_GRAPHS": "1"})
    req = gguf_request(cfg, H200, str(DENSE), None, v)
    assert not req.cuda_graphs and req.flash_attention is False
    on = gguf_request(cfg, H200, str(DENSE), None, _variant(Arg(flag="-fa", values=["on"])))
    assert on.flash_attention is True


def test_expect_on_a_gpu_is_predict_engine_llamacpp_of_the_served_gguf() -> None:
    cfg = _cfg()
    facts = EngineFacts(engine="llamacpp", flash_attention=False)
    exp = expect(cfg, H200, "llama-3.1-8b", "m", facts, None, gguf=GgufFile(path=str(MOE),
                 source="the server's /props"))  # fmt: skip
    p = exp.prediction
    assert p.deployment.engine == "llamacpp" and p.kind == "analytic"
    assert p.model.quantization.startswith("GGUF")  # not the catalog model's bf16
    want = predict_gguf(MOE, "h200", load_gpu("h200").mem_bw_GBps, cfg.single_context,
                        flash_attention=False, memory_GiB=load_gpu("h200").memory_GiB)  # fmt: skip
    assert p.decode_ms_per_token == want.decode_ms_per_token
    assert p.components_ms == want.components_ms
    assert exp.predictor == (
        "predict --engine llamacpp on tiny-moe-q4_k_m.header.gguf (from the server's /props), "
        "evidence: priors only"
    )
    assert exp.note is None and exp.model.path == str(MOE)
    two = expect(cfg, H200.model_copy(update={"gpus": 2}), None, "m", None, None,
                 gguf=GgufFile(path=str(MOE), source="--model"))  # fmt: skip
    assert two.note and "split over 2 GPUs is not predicted" in two.note


def test_expect_on_a_cpu_says_it_has_floors_only() -> None:
    exp = expect(_cfg(), CPU, None, "m", None, None, gguf=GgufFile(path=str(MOE), source="x"))
    p = exp.prediction
    assert p.kind == "cpu-floors" and p.expected is None and p.deployment.engine == "llamacpp"
    assert exp.predictor.startswith(NO_CPU_MODEL) and exp.note and exp.note.startswith(NO_CPU_MODEL)
    assert p.assumptions[0] == NO_CPU_MODEL
    info = read_gguf(MOE)
    # the routed experts in their GGUF types, one embedding row
    assert p.details.weight_bytes_read_per_gpu == int(
        sum(t.nbytes * s for t, s in weights_read(info))
    )
    assert p.details.weight_bytes_read_per_gpu < p.model.weight_bytes
    assert p.components_ms["weights"] == pytest.approx(
        p.details.weight_bytes_read_per_gpu / 10e9 * 1e3, rel=1e-4
    )
    # two streams route to more experts: more bytes, fewer than twice
    two = expect(_cfg(), CPU, None, "m", None, None, gguf=GgufFile(path=str(MOE), source="x"))
    req = two.prediction.request.model_copy(update={"batch": 2})
    from ceiling.predict.api import predict

    b2 = predict(req).details.weight_bytes_read_per_gpu
    assert p.details.weight_bytes_read_per_gpu < b2 < 2 * p.details.weight_bytes_read_per_gpu


@pytest.fixture
def props_server() -> Iterator[str]:
    """A server whose /props names a GGUF, as llama-server's does (model_path)."""

    class Props(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/props":
                self.send_error(404)
                return
            body = json.dumps({"model_path": str(MOE), "total_slots": 4}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serve(Props) as url:
        yield url


def test_the_gguf_is_found_in_model_variant_props_then_log(props_server: str) -> None:
    props = server_props(props_server)
    assert props is not None and props.model_path == str(MOE) and props.total_slots == 4
    assert server_props("http://127.0.0.1:9") is None  # nothing there: no /props, no error
    log = EngineFacts(engine="llamacpp", model=str(DENSE))
    got = find_gguf(_cfg(model_path=str(DENSE)), _variant(model=str(MOE)), log, props_server)
    assert got == GgufFile(path=str(DENSE), source="--model")
    # a catalog --model names no file: the variant's model is the one served
    got = find_gguf(_cfg(model_path="llama-3.1-8b"), _variant(model=str(MOE)), log, props_server)
    assert got == GgufFile(path=str(MOE), source="the variant's model")
    assert find_gguf(_cfg(), None, log, props_server) == GgufFile(
        path=str(MOE), source="the server's /props"
    )
    assert find_gguf(_cfg(), None, log, "http://127.0.0.1:9") == GgufFile(
        path=str(DENSE), source="the start-up log"
    )
    assert find_gguf(_cfg(), None, None, None) is None
    # only a llama.cpp target looks for one (a vLLM server's --model is its config)
    assert target_gguf(_cfg(model_path=str(DENSE)), None, "vllm", None, None) is None
    assert target_gguf(_cfg(model_path=str(DENSE)), None, "llamacpp", None, None) == GgufFile(
        path=str(DENSE), source="--model"
    )


def test_a_llamacpp_target_without_a_gguf_fails_the_stage_plainly() -> None:
    cfg = _cfg(model_path="llama-3.1-8b")  # a catalog model: what vLLM's path would predict
    res = DoctorResult(config=cfg)
    res.target = Target(url="http://127.0.0.1:9", engine="llamacpp")
    res.hardware = H200
    _predict_stage(_Recorder(res, progress=False), res, cfg, None, [], "m")
    st = res.stages[-1]
    assert st.status == "failed" and st.message and st.message.startswith("a llama.cpp server")
    assert res.prediction is None  # no vLLM bf16 figure in its place


def test_the_stage_names_the_predictor_and_evidence() -> None:
    cfg = _cfg(model_path=str(DENSE))
    res = DoctorResult(config=cfg)
    res.target = Target(url="http://127.0.0.1:9", engine="llamacpp")
    res.hardware = H200
    _predict_stage(_Recorder(res, progress=False), res, cfg, None, [], "m")
    st = res.stages[-1]
    assert st.status == "ok" and st.message
    assert st.message.startswith(
        "predict --engine llamacpp on tiny-llama-f16.header.gguf (from --model), evidence: "
        "priors only: "
    )
    assert res.prediction is not None and res.prediction.deployment.engine == "llamacpp"
