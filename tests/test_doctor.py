"""The doctor flow against a synthetic OpenAI-compatible server (no engine needed).

The synthetic server emits tokens on a schedule we choose (4 ms per token), so the doctor's
measured step and its attribution can be checked against what really happened; the model
directory is a real config.json with weight files of known size. A server that dies mid-doctor
must leave a report that says so and keeps what was measured.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from ceiling.bench.results import LevelResult
from ceiling.cli import main
from ceiling.diagnose.hypotheses import NcclHypothesis
from ceiling.diagnose.measured import measured_step
from ceiling.diagnose.schema import DoctorResult
from ceiling.errors import CeilingError
from ceiling.flows.doctor import DoctorConfig
from ceiling.flows.doctor import run as _run_doctor
from ceiling.predict.api import load_spec
from ceiling.predict.cpu import weight_bytes_per_step
from ceiling.report import render
from ceiling.spec.hardware import CpuHardware
from gpu_box import gpu_box, use_gpu_box
from sse_server import Plan, SSEServer

ITL_S = 0.004


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    cfg = {  # the tiny Llama's shape (src/ceiling/demo/tiny_model.py): 1.8 MB of fp32 weights
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "torch_dtype": "float32",
    }
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "model.safetensors").write_bytes(os.urandom(1_700_000))
    return d


def run_doctor(cfg: DoctorConfig) -> DoctorResult:
    """The doctor as the CLI runs it: the report rendered from the saved doctor.json."""
    return _run_doctor(cfg, report=render)


def _cfg(url: str, model_dir: Path, out: Path, **kw) -> DoctorConfig:
    base = dict(
        url=url,
        model_path=str(model_dir),
        max_tokens=24,
        repeat=2,
        warmup=1,
        concurrency=[1, 2],
        concurrency_max_tokens=12,
        concurrency_requests=4,
        out_dir=str(out),
        progress=False,
        telemetry=False,
        # the synthetic server streams timed tokens, not a model's answers: no sanity gate
        sanity=False,
    )
    base.update(kw)
    return DoctorConfig(**base)


def test_doctor_on_a_running_server(model_dir, tmp_path):
    with SSEServer(Plan(itl_s=ITL_S, ttft_s=0.01)) as srv:
        res = run_doctor(
            _cfg(srv.url, model_dir, tmp_path / "out", target_tok_s=1000.0, telemetry=True)
        )
    assert not res.server_died
    # no NVIDIA GPU here: the sampler says so instead of failing the doctor
    assert res.telemetry is not None
    assert res.telemetry.available is False and res.telemetry.reason
    a = res.attribution
    assert a is not None
    # the measured step is the server's 4 ms schedule (plus client/transport jitter)
    assert a.measured_step_ms == pytest.approx(ITL_S * 1000, rel=0.25)
    assert a.bound_by == "kernel inefficiency / host overhead"
    weights = next(c for c in a.components if c.name == "weights")
    hw = res.hardware
    assert isinstance(hw, CpuHardware)
    read = weight_bytes_per_step(load_spec(str(model_dir)), 1)  # the embedding: one row
    assert 1.5e6 < read < 1.9e6
    assert weights.predicted_ms == pytest.approx(read / (hw.mem_bw_GBps * 1e9) * 1e3, rel=1e-4)
    v = res.verdict
    assert v is not None
    assert v.bottleneck.case == "host-bound" and v.bottleneck.hardware_kind == "cpu"
    assert v.headline.startswith("Host / launch-overhead-bound, not bandwidth-bound")
    assert v.target is not None and v.target.met is False
    assert v.cpu_read is not None and v.cpu_read.step_ms > v.cpu_read.read_ms  # host-bound
    assert res.prediction is not None and res.prediction.kind == "cpu-floors"
    assert [lv.concurrency for lv in res.levels] == [1, 2]
    stages = {s.name: s.status for s in res.stages}
    assert stages["bench single"] == "ok" and stages["bench concurrency"] == "ok"
    assert stages["inspect log"] == "skipped"
    out = tmp_path / "out"
    for f in ("doctor.json", "report.md", "report.html", "bench-single.json"):
        assert (out / f).is_file()
    saved = json.loads((out / "doctor.json").read_text())
    assert saved["schema_version"] == 1 and saved["verdict"]["headline"] == v.headline
    # the file reads back into the nouns it was written from, strictly
    back = DoctorResult.model_validate_json((out / "doctor.json").read_text())
    assert back.verdict == v and back.attribution == a and back.prediction == res.prediction


def test_server_dying_mid_doctor_keeps_what_was_measured(model_dir, tmp_path):
    # warm-up 1 + 2 repeats x 5 requests = 11 single-stream requests; die in the sweep.
    with SSEServer(lambda i, _b: Plan(itl_s=ITL_S, ttft_s=0.01, die=i == 13)) as srv:
        res = run_doctor(_cfg(srv.url, model_dir, tmp_path / "out"))
    assert res.server_died
    assert "concurrency" in res.server_death and "stopped answering" in res.server_death
    assert res.bench["single"].completed == 10  # everything before the death is kept
    assert res.attribution is not None
    assert res.verdict is not None and res.verdict.server_death == res.server_death
    assert res.verdict.notes[0].startswith("The server died")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "The server died during the doctor run" in md
    assert "bench concurrency" in md


def test_doctor_without_a_server(tmp_path, model_dir):
    with pytest.raises(CeilingError, match="needs a server"):
        run_doctor(DoctorConfig(out_dir=str(tmp_path)))
    with pytest.raises(CeilingError, match="no OpenAI-compatible server"):
        run_doctor(_cfg("http://127.0.0.1:9", model_dir, tmp_path))
    # the CLI turns it into one line + fix, exit code 4 (the server at --url)
    assert main(["doctor", "--url", "http://127.0.0.1:9", "--out-dir", str(tmp_path)]) == 4


def test_cli_doctor_json(model_dir, tmp_path, capsys):
    with SSEServer(Plan(itl_s=ITL_S, ttft_s=0.01)) as srv:
        rc = main(
            [
                "doctor",
                "--url",
                srv.url,
                "--model",
                str(model_dir),
                "--max-tokens",
                "16",
                "--repeat",
                "2",
                "--concurrency",
                "none",
                "--no-telemetry",
                "--no-sanity",
                "--out-dir",
                str(tmp_path / "o"),
                "--json",
            ]
        )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "doctor" and doc["bench"].get("concurrency") is None
    assert any(s["name"] == "bench concurrency" and s["status"] == "skipped" for s in doc["stages"])
    assert {"name": "sanity", "status": "skipped", "seconds": 0.0, "message": "turned off"} in doc[
        "stages"
    ]
    # doctor.json's `model` block keeps the footprint keys it had before the typed result
    m = doc["model"]
    assert m["layers"] == 2 and m["hidden_size"] == 128 and m["dtype"] == "float32"
    assert m["kv_bytes_per_token"] == 2 * 2 * 128 * 4  # K and V, 2 layers, hidden 128, fp32
    assert m["params"] > 0 and m["weight_bytes"] > 0 and m["source"].endswith("config.json")


def test_doctor_gpu_path_uses_predict_and_answers_the_nccl_hypothesis(tmp_path, monkeypatch):
    """The story's deployment (Kimi-K2.5, 8 GPUs over PCIe, TP=8) served at ~12 ms per token:
    the measurement lands near predict's ceiling, and NCCL tuning is answered as latency-bound
    at 14 KB per allreduce (hidden 7168 x 2 bytes). The stand-in server runs "on" 8 of them."""
    use_gpu_box(monkeypatch, gpu_box(8))
    with SSEServer(Plan(itl_s=0.012, ttft_s=0.01)) as srv:
        res = run_doctor(
            DoctorConfig(
                url=srv.url,
                model_path="kimi-k2.5",
                gpu="rtx-pro-6000",
                tp=8,
                max_tokens=24,
                repeat=2,
                concurrency=[],
                out_dir=str(tmp_path),
                progress=False,
                sanity=False,
                telemetry=False,
                target_tok_s=100.0,
            )
        )
    assert res.hardware is not None and res.hardware.kind == "gpu"
    pred, a, v = res.prediction, res.attribution, res.verdict
    assert pred is not None and a is not None and v is not None
    names = {c.name for c in a.components}
    assert {"weights", "collectives", "launch"} <= names
    assert a.predicted_step_ms == pytest.approx(pred.decode_ms_per_token, rel=0.02)
    assert v.predicted_tok_s == pred.expected_tok_s == pred.decode_tok_s_per_stream
    assert v.bound_tok_s == pred.bound_tok_s
    nccl = next(h for h in v.hypotheses if isinstance(h, NcclHypothesis))
    assert nccl.message_bytes == 7168 * 2 and nccl.latency_bound
    assert nccl.predicted_gain_pct is not None and nccl.predicted_gain_pct < 2.0
    assert v.changes and v.changes[0].kind == "what-if"
    gains = [c.predicted_gain_pct for c in v.changes]
    assert gains == sorted(gains, reverse=True)  # type: ignore[type-var]
    # every what-if listed can be deployed (fits in memory)
    fits = {w.change: w.fits_in_memory for w in pred.what_if}
    assert all(fits[c.change] for c in v.changes if c.kind == "what-if")
    assert v.target is not None and v.target.met is False


ENGINE_PY = Path(__file__).resolve().parents[1] / ".engines" / "vllm" / "bin" / "python"


@pytest.mark.skipif(not ENGINE_PY.exists(), reason="preflight needs vLLM's flags (.engines/vllm)")
def test_engine_dying_at_launch_leaves_a_report(model_dir, tmp_path):
    """The variant passes preflight (real vLLM flag table) but its process dies while starting:
    the doctor raises the classified death and still writes doctor.json and the report."""
    die = tmp_path / "die.py"
    die.write_text(
        "import sys\n"
        "print('(EngineCore pid=1) ERROR 11-29 08:59:26 [core.py:700] EngineCore failed to "
        "start.', flush=True)\n"
        "print('RuntimeError: out of memory while allocating KV cache', flush=True)\n"
        "sys.exit(1)\n"
    )
    v = tmp_path / "v.yaml"
    v.write_text(
        f"engine: vllm\nmodel: {model_dir}\nserved_model_name: tiny\npython: {ENGINE_PY}\n"
        f"command: [{json.dumps(sys.executable)}, {json.dumps(str(die))}]\n"
    )
    out = tmp_path / "out"
    with pytest.raises(CeilingError, match="engine died"):
        run_doctor(
            DoctorConfig(
                variant=str(v),
                out_dir=str(out),
                progress=False,
                sanity=False,
                concurrency=[],
                launch_timeout_s=60,
            )
        )
    doc = json.loads((out / "doctor.json").read_text())
    assert doc["server_died"] and "out of memory" in doc["server_death"]
    assert {s["name"]: s["status"] for s in doc["stages"]}["launch"] == "failed"
    assert "The server died during the doctor run" in (out / "report.md").read_text()
    # this CPU was measured before the launch: with its cores still free, and kept on a death
    names = [s["name"] for s in doc["stages"]]
    assert names.index("hardware") < names.index("launch")
    assert doc["hardware"]["kind"] == "cpu" and doc["hardware"]["measured"]


def test_engine_log_facts_drive_the_prediction_and_the_changes(tmp_path, monkeypatch):
    """With --log, the start-up facts (TP=8 from the engine config line) set the configuration
    predict is asked about, and the log's configurable findings join the ranked changes."""
    use_gpu_box(monkeypatch, gpu_box(8))
    log = Path(__file__).parent / "fixtures" / "logs" / "vllm_0.11_kimi_tp8_pcie.log"
    with SSEServer(Plan(itl_s=0.012, ttft_s=0.01)) as srv:
        res = run_doctor(
            DoctorConfig(
                url=srv.url,
                log=str(log),
                engine="vllm",
                model_path="kimi-k2.5",
                gpu="rtx-pro-6000",
                max_tokens=16,
                repeat=2,
                concurrency=[],
                out_dir=str(tmp_path),
                progress=False,
                sanity=False,
                telemetry=False,
            )
        )
    assert res.facts is not None and res.facts.tensor_parallel_size == 8
    assert res.prediction is not None and res.prediction.deployment.tp == 8
    assert res.prediction.deployment.cuda_graphs is True
    by = {f.id: f for f in res.findings}
    assert "custom-allreduce-off" in by
    # the GPU (--gpu rtx-pro-6000: compute capability 12.0) rules out the allreduce + RMSNorm
    # fusion (it exists for 9.0 and 10.x only); the findings of the log are checked against it
    assert "allreduce-fusion-off" not in by
    # a finding whose advice rests on unknown facts (P2P here) does not become a change
    assert by["custom-allreduce-off"].fix is None and by["custom-allreduce-off"].withheld
    assert res.verdict is not None
    sources = {c.source for c in res.verdict.changes}
    assert "finding custom-allreduce-off" not in sources
    stages = [s.name for s in res.stages]
    assert stages.index("inspect log") < stages.index("predict")


def test_api_key_never_reaches_the_files(model_dir, tmp_path, monkeypatch):
    key = "sk-test-not-for-files-123"
    monkeypatch.setenv("CEILING_API_KEY", key)
    log = tmp_path / "server.log"
    log.write_text(
        "(APIServer pid=1) INFO 11-29 08:58:59 [api_utils.py:286] non-default args: "
        f"{{'host': '127.0.0.1', 'api_key': ['{key}'], 'served_model_name': ['synthetic']}}\n"
    )
    with SSEServer(Plan(itl_s=ITL_S, ttft_s=0.01)) as srv:
        res = run_doctor(_cfg(srv.url, model_dir, tmp_path / "out", log=str(log), concurrency=[]))
    # the log was read, and the key it quotes is masked where it was parsed ...
    assert res.facts is not None
    assert res.facts.non_default_args["api_key"] == "***"
    assert res.facts.non_default_args["served_model_name"] == ["synthetic"]
    assert srv.headers and srv.headers[0].get("Authorization") == f"Bearer {key}"
    for name in ("doctor.json", "report.md", "report.html"):  # ... which no file keeps
        assert key not in (tmp_path / "out" / name).read_text()


FAKE_ENGINE = r"""
import asyncio, json, os, sys
from aiohttp import web
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
name = args[args.index("--served-model-name") + 1]
die_after = int(os.environ["FAKE_DIE_AFTER"])
seen = 0
async def models(_r):
    return web.json_response({"data": [{"id": name, "owned_by": "vllm"}]})
async def health(_r):
    return web.Response(text="")
async def complete(req):
    global seen
    seen += 1
    if seen > die_after:
        print("(EngineCore pid=2) ERROR EngineDeadError: EngineCore encountered an issue.",
              flush=True)
        os._exit(1)
    body = await req.json()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(req)
    for _ in range(int(body.get("max_tokens") or 8)):
        await asyncio.sleep(0.003)
        c = {"choices": [{"index": 0, "text": " a", "finish_reason": None}]}
        await resp.write(("data: " + json.dumps(c) + "\n\n").encode())
    await resp.write(b"data: [DONE]\n\n")
    return resp
app = web.Application()
app.router.add_get("/v1/models", models)
app.router.add_get("/health", health)
app.router.add_post("/v1/completions", complete)
print("INFO:     Application startup complete.", flush=True)
web.run_app(app, host="127.0.0.1", port=port, print=None)
"""


@pytest.mark.skipif(not ENGINE_PY.exists(), reason="preflight needs vLLM's flags (.engines/vllm)")
def test_launched_engine_dying_mid_doctor(model_dir, tmp_path):
    """doctor --variant: the engine it launched dies during the concurrency sweep; the report
    names the classified cause from the engine's log and keeps the single-stream results."""
    fake = tmp_path / "fake_engine.py"
    fake.write_text(FAKE_ENGINE)
    v = tmp_path / "v.yaml"
    v.write_text(
        f"engine: vllm\nmodel: {model_dir}\nserved_model_name: tiny\npython: {ENGINE_PY}\n"
        f"command: [{json.dumps(sys.executable)}, {json.dumps(str(fake))}]\n"
        "env: {FAKE_DIE_AFTER: '13'}\n"
    )
    out = tmp_path / "out"
    res = run_doctor(
        DoctorConfig(
            variant=str(v),
            model_path=str(model_dir),
            out_dir=str(out),
            max_tokens=16,
            repeat=2,
            concurrency=[1, 2],
            concurrency_max_tokens=8,
            concurrency_requests=4,
            telemetry=False,
            progress=False,
            sanity=False,
            launch_timeout_s=60,
        )
    )
    assert res.server_died
    assert "during bench concurrency" in res.server_death
    assert "engine core failed" in res.server_death and "EngineDeadError" in res.server_death
    assert res.bench["single"].completed == 10 and res.attribution is not None
    md = (out / "report.md").read_text()
    assert "The server died during the doctor run" in md and "EngineDeadError" in md


def test_measured_step_prefers_the_engine_when_the_client_saw_bursts():
    def run(client_tok_s, server_itl_ms):
        r = {
            "decode_tok_s_per_stream": client_tok_s,
            "ci": {
                "decode_tok_s_per_stream": {
                    "mean": client_tok_s,
                    "low": client_tok_s * 0.9,
                    "high": client_tok_s * 1.1,
                }
            },
        }
        if server_itl_ms is not None:
            r["server_metrics"] = {
                "available": True,
                "quantities": {
                    "itl": {
                        "metric": "vllm:inter_token_latency_seconds",
                        "count": 100,
                        "server_mean_ms": server_itl_ms,
                    }
                },
            }
        return LevelResult.model_validate(r)

    m = measured_step(run(660.0, 4.7))  # tokens arrived in bursts: client 1.5 ms, engine 4.7 ms
    assert m.step_ms == pytest.approx(4.7) and m.step_ci_ms is None
    assert "engine's own inter-token latency" in m.source and "1.52 ms" in m.source
    m = measured_step(run(210.0, 4.9))  # they agree: the client's rate and its CI stand
    assert m.step_ms == pytest.approx(1000 / 210.0)
    assert m.step_ci_ms == (pytest.approx(1000 / 231.0), pytest.approx(1000 / 189.0))
    assert "agrees" in m.source
    m = measured_step(run(210.0, None))
    assert m.source.startswith("client-measured") and "agrees" not in m.source
    assert measured_step(None) is None
