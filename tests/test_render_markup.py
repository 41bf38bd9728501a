"""Text that comes from outside (a rank's error, a variant's name, a skip reason, a model's
assumption) is printed as it is: ``[rank0]:`` or ``[gpu]`` is not read as Rich markup and
swallowed."""

from __future__ import annotations

import pytest

RANK_ERROR = "[rank0]: RuntimeError: NCCL error [bold]x[/bold]"


def _printed(capsys: pytest.CaptureFixture[str]) -> str:
    """What was printed, its line breaks and runs of spaces as one space (lines wrap at 80)."""
    return " ".join(capsys.readouterr().out.split())


def test_commbench_prints_rank_errors_and_variant_names_as_they_are(capsys):
    from ceiling.probe.commbench import CommbenchResult, ModelCost, TokenCost, VariantRun
    from ceiling.render import probe

    res = CommbenchResult(
        backend="nccl",
        device="cuda",
        runs=[
            VariantRun(variant="[gpu]", env={"NCCL_ALGO": "[ring]"}, world_size=2,
                       backend="nccl", error=RANK_ERROR),
        ],
        model_cost=ModelCost(
            model="[m]", hidden=8, layers=1, allreduces_per_token=2,
            rows=[TokenCost(variant="[gpu]", world_size=2, in_cuda_graph=False, batch=1,
                            message_bytes=16, latency_us=1.0, per_token_ms=0.002)],
        ),
    )  # fmt: skip
    probe.commbench(res)
    out = _printed(capsys)
    assert RANK_ERROR in out
    assert "variant=[gpu]" in out and "NCCL_ALGO=[ring]" in out
    assert "[gpu]" in out.split("per-token allreduce cost")[1]


def test_calibrate_prints_skip_reasons_as_they_are(capsys):
    from ceiling.probe.calibrate import CalibrateResult
    from ceiling.probe.calibrate_ops import OpsResult
    from ceiling.render import probe

    res = CalibrateResult(
        device="cuda", device_name="[dev]", torch_version="2", mem_read_GBps=1.0, copy_GBps=1.0,
        launch_us_eager=1.0, skipped={"[fp8]": RANK_ERROR},
    )  # fmt: skip
    probe._calibrate(res, None)
    out = _printed(capsys)
    assert f"[fp8]: not measured: {RANK_ERROR}" in out and "[dev]" in out
    ops = OpsResult(device="cuda", device_name="d", torch_version="2", models=[], tp=1,
                    skipped={"[attn]": RANK_ERROR})  # fmt: skip
    probe._calibrate_ops(ops)
    assert f"[attn] not measured: {RANK_ERROR}" in _printed(capsys)


def test_predict_prints_assumptions_and_what_ifs_as_they_are(capsys):
    from ceiling.predict.api import predict
    from ceiling.predict.schema import PredictRequest, WhatIf
    from ceiling.render.predict import print_prediction

    p = predict(PredictRequest(model="llama-3.1-8b", gpu="h200"))
    p.assumptions.append("weights read once per step [gpu]")
    p.what_if.append(
        WhatIf(change="--kv-cache-dtype [fp8]", decode_tok_s_per_stream=1.0, delta_pct=0.0,
               decode_ms_per_token=1.0, fits_in_memory=True, note="[rank0]: note")
    )  # fmt: skip
    print_prediction(p)
    out = _printed(capsys)
    assert "weights read once per step [gpu]" in out
    assert "[fp8]" in out and "[rank0]: note" in out
