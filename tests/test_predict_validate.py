"""predict refuses what cannot exist (impossible combinations and physical values) with one
error + fix line, accepts every published setup, and speaks ROCm's words on AMD GPUs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from validation.calibration import request_for, validation_csvs

from ceiling.cli import main
from ceiling.errors import CeilingError
from ceiling.predict.api import PredictRequest, predict
from ceiling.predict.validate import check_request, vendor_of
from ceiling.spec.hardware import load_gpu

BASE = dict(model="llama-3.1-8b", gpu="h200")


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (dict(gpu="mi300x", engine="trtllm"), "does not run on mi300x"),
        (dict(model="llama-3.1-70b", gpu="rtx-pro-6000", tp=4, link="nvlink4"), "no NVLink"),
        (dict(model="llama-3.1-70b", gpu="h100-sxm", tp=8, link="xgmi"), "xGMI"),
        (dict(model="llama-3.1-70b", gpu="mi300x", tp=8, link="nvlink4"), "its link is xgmi"),
        (dict(model="llama-3.1-70b", gpu="h100-sxm", tp=8, link="nvlink5"), "its link is nvlink4"),
        (dict(link="nvlink4"), "one GPU per replica"),
        (dict(link="pcie5-switch"), "one GPU per replica"),
        (dict(gpu="a100-80", tp=2, link="pcie5-switch"), "PCIe Gen4"),
        (dict(gpu="rtx-3090", tp=4, link="nvlink3-bridge"), "joins two GPUs"),
        (dict(tp=2, gpus=1), "needs 2 GPUs"),
        (dict(mem_clock=1e308), "--mem-clock"),
        (dict(mem_clock=1.0), "--mem-clock"),
        (dict(mem_clock=float("inf")), "not a finite number"),
        (dict(power_limit=1e9), "--power-limit"),
        (dict(power_limit=1.0), "--power-limit"),
        (dict(context=10**9), "--context"),
        (dict(batch=10**8), "--batch"),
        (dict(prompt_len=10**9), "--prompt-len"),
    ],
)
def test_impossible_requests_are_refused(extra, needle, priors_only):
    with pytest.raises(CeilingError) as exc:
        predict(PredictRequest(**{**BASE, **extra}))
    assert needle in exc.value.message
    assert exc.value.fix


def test_possible_neighbours_are_accepted(priors_only):
    """The rules refuse the impossible only: the GPU's own NVLink, its -nop2p twin, a slower
    PCIe generation than the GPU's, a bridge over a pair, a 'self' link on one GPU (doctor),
    a realistic overclock and power cap."""
    ok = [
        dict(model="llama-3.1-70b", gpu="h100-sxm", tp=8, link="nvlink4"),
        dict(model="llama-3.1-70b", gpu="h100-sxm", tp=8, link="nvlink4-nop2p"),
        dict(model="llama-3.1-70b", gpu="rtx-pro-6000", tp=4, link="pcie4-switch"),
        dict(gpu="rtx-3090", tp=2, link="nvlink3-bridge"),
        dict(link="self"),
        dict(gpu="rtx-pro-6000", mem_clock=14000, power_limit=300),
        dict(model="llama-3.1-70b", gpu="mi300x", tp=8, engine="sglang"),
    ]
    for extra in ok:
        predict(PredictRequest(**{**BASE, **extra}))


def test_every_published_row_passes_validation():
    """No published setup (every row of the reference files) is refused as impossible."""
    for path in validation_csvs():
        for row in csv.DictReader(path.open()):
            req, _ = request_for(row)
            if req is not None:
                check_request(req)


def test_gpu_file_with_impossible_numbers(tmp_path, priors_only):
    f = tmp_path / "gpu.yaml"
    f.write_text("arch: ada\nsm: 89\nmemory_GiB: 48\nmem_bw_GBps: 1.0e9\ntflops: {bf16: 300}\n")
    with pytest.raises(CeilingError) as exc:
        predict(PredictRequest(model="llama-3.1-8b", gpu=str(f)))
    assert "mem_bw_GBps" in exc.value.message and "outside what any GPU has" in exc.value.message


def _config(tmp_path, **over):
    cfg = json.loads(Path("src/ceiling/data/models/llama-3.1-8b.json").read_text())
    cfg.update(over)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def test_model_config_beyond_any_model(tmp_path, priors_only):
    with pytest.raises(CeilingError) as exc:
        predict(PredictRequest(model=_config(tmp_path, num_key_value_heads=64), gpu="h200"))
    assert "64 KV heads but 32 attention heads" in exc.value.message
    with pytest.raises(CeilingError) as exc:
        predict(PredictRequest(model=_config(tmp_path, hidden_size=10**7), gpu="h200"))
    assert "'hidden_size'" in exc.value.message and "no published model" in exc.value.message


def test_cli_prints_one_error_and_fix_and_exits_2(capsys):
    rc = main(["predict", "--model", "llama-3.1-8b", "--gpu", "mi300x", "--engine", "trtllm"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("error:") == 1 and "fix:" in err and "Traceback" not in err


def test_amd_predictions_speak_rocm(priors_only):
    """On ROCm every text a person reads names RCCL, HIP graphs and xGMI, never CUDA, NCCL or
    NVLink; TensorRT-LLM as a what-if says it cannot run there."""
    assert vendor_of(load_gpu("mi300x")) == "amd" and vendor_of(load_gpu("h200")) == "nvidia"
    p = predict(PredictRequest(model="llama-3.1-70b", gpu="mi300x", tp=8, what_if=True))
    texts = [*p.assumptions, *p.component_kind.values()]
    for w in p.what_if or []:
        texts += [w.change, w.moved, w.note]
    for block in (p.expected, p.bound):
        assert block is not None
        texts += [op.note for op in block.ops]
    joined = "\n".join(texts)
    for word in ("CUDA", "NCCL", "NVLink", "(nvlink)"):
        assert word not in joined, word
    assert "RCCL" in joined and "HIP graphs" in joined
    rows = {w.change: w for w in p.what_if or []}
    trt = [w for c, w in rows.items() if "trtllm" in c]
    assert trt and all("cannot run" in w.note and w.decode_tok_s_per_stream == 0 for w in trt)
    # NVIDIA keeps its words
    q = predict(PredictRequest(model="llama-3.1-70b", gpu="h200", tp=8, what_if=True))
    assert any("CUDA graphs" in w.change for w in q.what_if or [])
