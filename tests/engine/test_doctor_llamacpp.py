"""The doctor on the real llama.cpp CPU engine (both flavours, the tiny GGUF): the predict stage
routes the target through predict --engine llamacpp with the GGUF it serves, never through
vLLM's bf16 model, and says plainly that a CPU has floors only.

The GGUF is found where the doctor can read it: the launched variant's model; for a running
server, llama-server's /props (``model_path``) or, for llama-cpp-python's server (no /props),
the file its start-up log loaded. The tiny model is random: the sanity gate calls it broken and
the override is given (what the gate is for). Runs are short (32 tokens, 2 repeats).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ceiling.flows.doctor import DoctorConfig
from ceiling.flows.doctor import run as run_doctor
from ceiling.predict.gguf import read_gguf
from ceiling.predict.llamacpp import weights_read
from ceiling.predict.llamacpp_cpu import NO_CPU_MODEL

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]


def _doctor(out: Path, **kw: object):
    return run_doctor(
        DoctorConfig(
            max_tokens=32,
            repeat=2,
            concurrency=[],
            telemetry=False,
            measure_cpu=False,  # the labelled assumed rates: no CPU measurement on a busy box
            accept_broken_output="random tiny GGUF: the gate is right to call it broken",
            out_dir=str(out),
            progress=False,
            **kw,
        )
    )


def _predict_stage(res):
    return next(s for s in res.stages if s.name == "predict")


def _assert_llamacpp_floors(res, gguf: Path, source: str) -> None:
    st = _predict_stage(res)
    assert st.status == "ok", st.message
    assert st.message.startswith(f"{NO_CPU_MODEL}: {gguf.name} (from {source}): bound ")
    p = res.prediction
    assert p is not None and p.kind == "cpu-floors"
    assert p.deployment.engine == "llamacpp" and p.request.model == str(gguf)
    assert p.model.quantization.startswith("GGUF")  # the file's types, not a bf16 config
    info = read_gguf(gguf)
    assert p.details.weight_bytes_read_per_gpu == int(
        sum(t.nbytes * s for t, s in weights_read(info))
    )
    assert res.prediction_note and res.prediction_note.startswith(NO_CPU_MODEL)
    # the attribution reads the same prediction: the floors, then the remainder
    a = res.attribution
    assert a is not None and {c.name for c in a.components} == {"weights", "kv", "compute"}
    assert a.basis.startswith("CPU floors")


def test_a_launched_llamacpp_variant_is_predicted_from_its_gguf(
    cpu_tiny_llamacpp_variant, tiny_gguf, tmp_path
):
    v = cpu_tiny_llamacpp_variant
    path = tmp_path / "variant.yaml"
    example = REPO / "examples" / "variants" / f"cpu-tiny-{v.engine}.yaml"
    path.write_text(yaml.safe_dump({"extends": str(example), "model": str(tiny_gguf)}))
    res = _doctor(tmp_path / "out", variant=str(path))
    assert not res.server_died and res.target.engine == v.engine
    _assert_llamacpp_floors(res, tiny_gguf, "the variant's model")


def test_a_running_llamacpp_server_is_predicted_from_the_file_it_names(
    llamacpp_server, tiny_gguf, tmp_path
):
    if llamacpp_server.engine.name == "llamacpp":
        # llama-server: told by /v1/models (owned_by), the file from /props; no log, no --model
        res = _doctor(tmp_path / "out", url=llamacpp_server.url)
        assert res.target.engine == "llamacpp"
        _assert_llamacpp_floors(res, tiny_gguf, "the server's /props")
    else:
        # llama-cpp-python: owned_by "me" says nothing, no /props: the start-up log tells the
        # engine and the file it loaded
        res = _doctor(tmp_path / "out", url=llamacpp_server.url, log=str(llamacpp_server.log_path))
        assert res.target.engine is None and res.facts is not None
        _assert_llamacpp_floors(res, tiny_gguf, "the start-up log")
