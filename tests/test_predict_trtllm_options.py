"""TensorRT-LLM's LLM-API options (``--trtllm-option``, ``--trtllm-config``) map onto the step
model's knobs through data/predict/trtllm_options.yaml; what predict cannot express is
refused, and other engines are untouched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest

from ceiling.cli import main
from ceiling.errors import CeilingError
from ceiling.predict.api import PredictRequest, predict
from ceiling.predict.engine_options import apply_trtllm_options, parse_options, trtllm_options

DS = dict(model="deepseek-v3", gpu="h200", tp=8, engine="trtllm")


def _ms(**kw: Any) -> float:
    return predict(PredictRequest.model_validate({**DS, **kw})).decode_ms_per_token


def test_each_option_moves_its_knob_exactly_as_the_flag_does(priors_only):
    assert _ms(trtllm_options={"cuda_graph_config": None}) == _ms(cuda_graphs=False)
    assert _ms(trtllm_options={"cuda_graph_config": None}) > 2 * _ms()
    assert _ms(trtllm_options={"cuda_graph_config": {"max_batch_size": 64}}) == _ms()
    assert _ms(trtllm_options={"disable_overlap_scheduler": True}) == _ms(async_scheduling=False)
    assert _ms(trtllm_options={"allreduce_strategy": "NCCL"}) == _ms(allreduce="nccl")
    assert _ms(trtllm_options={"allreduce_strategy": "ONESHOT"}) == _ms(allreduce="oneshot")
    assert _ms(trtllm_options={"allreduce_strategy": "NCCL"}) != _ms(allreduce="oneshot")
    assert _ms(trtllm_options={"kv_cache_config.dtype": "fp8"}, context=65536) == _ms(
        kv_dtype="fp8", context=65536
    )


def test_attention_dp_is_tp1_dp_ranks_with_ep(priors_only):
    adp = predict(PredictRequest(**DS, ep=8, batch=4, trtllm_options={"enable_attention_dp": True}))
    d = adp.deployment
    assert (d.tp, d.dp, d.ep) == (1, 8, 8)
    plain = predict(PredictRequest(model="deepseek-v3", gpu="h200", tp=1, dp=8, gpus=8, ep=8,
                                   engine="trtllm", batch=4))  # fmt: skip
    assert adp.decode_ms_per_token == plain.decode_ms_per_token
    assert any("enable_attention_dp" in a for a in adp.assumptions)
    with pytest.raises(CeilingError, match="TP-sharded experts"):
        predict(PredictRequest(**DS, trtllm_options={"enable_attention_dp": True}))
    with pytest.raises(CeilingError, match="dense model"):
        predict(PredictRequest(model="llama-3.1-70b", gpu="h200", tp=4, engine="trtllm",
                               trtllm_options={"enable_attention_dp": True}))  # fmt: skip


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"allreduce_strategy": "MNNVL"}, "not modelled"),
        ({"allreduce_strategy": "TWOSHOT"}, "not modelled"),
        ({"allreduce_strategy": "FASTEST"}, "not one of its values"),
        ({"cuda_graph_config": "yes"}, "not one of its values"),
        ({"max_seq_len": 4096}, "not a TensorRT-LLM option predict maps"),
    ],
)
def test_what_cannot_be_expressed_is_refused(priors_only, options, needle):
    with pytest.raises(CeilingError, match=needle):
        predict(PredictRequest(**DS, trtllm_options=options))


def test_other_engines_refuse_the_options_and_are_unchanged(priors_only):
    with pytest.raises(CeilingError, match="--engine vllm"):
        predict(PredictRequest(model="deepseek-v3", gpu="h200", tp=8,
                               trtllm_options={"allreduce_strategy": "NCCL"}))  # fmt: skip
    req = PredictRequest(model="deepseek-v3", gpu="h200", tp=8)
    assert apply_trtllm_options(req) == (req, [])


def test_a_trtllm_serve_config_file_is_read_and_unread_keys_are_named(priors_only, tmp_path):
    cfg = tmp_path / "extra.yaml"
    cfg.write_text(
        "cuda_graph_config:\n  enable_padding: true\n  max_batch_size: 128\n"
        "disable_overlap_scheduler: true\n"
        "kv_cache_config:\n  dtype: fp8\n  free_gpu_memory_fraction: 0.8\n"
        "max_batch_size: 128\n"
    )
    p = predict(PredictRequest(**DS, trtllm_config=str(cfg)))
    assert p.deployment.kv_dtype == "fp8" and p.deployment.cuda_graphs
    assert p.decode_ms_per_token == _ms(kv_dtype="fp8", async_scheduling=False)
    unread = [a for a in p.assumptions if "not read" in a]
    assert unread and "max_batch_size" in unread[0]
    assert "kv_cache_config.free_gpu_memory_fraction" in unread[0]
    # a flag given beside the file wins
    both = predict(PredictRequest(**DS, trtllm_config=str(cfg),
                                  trtllm_options={"disable_overlap_scheduler": False}))  # fmt: skip
    assert both.decode_ms_per_token == _ms(kv_dtype="fp8")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(CeilingError, match="not a YAML mapping"):
        predict(PredictRequest(**DS, trtllm_config=str(bad)))
    with pytest.raises(CeilingError, match="--trtllm-config not found"):
        predict(PredictRequest(**DS, trtllm_config=str(tmp_path / "missing.yaml")))


def test_every_mapped_value_is_a_value_of_its_knob():
    """The data file can only name knob values the request accepts (and cites its source)."""
    data = trtllm_options()
    fields = PredictRequest.model_fields
    for key, rule in data.options.items():
        assert rule.why.strip(), key
        for value in rule.values.values():
            if rule.knob == "allreduce":
                assert value in get_args(fields["allreduce"].annotation)
            elif rule.knob == "kv_dtype":
                PredictRequest(model="llama-3.1-8b", gpu="h200", kv_dtype=value)
            else:
                assert isinstance(value, bool), (key, value)
        assert not set(rule.values) & set(rule.unmodelled), key
    assert "llm_args.py" in data.source


def test_parse_options_reads_yaml_values_and_refuses_a_bare_key():
    items = ["cuda_graph_config=null", "enable_attention_dp=true", "allreduce_strategy=NCCL"]
    assert parse_options(items) == {
        "cuda_graph_config": None,
        "enable_attention_dp": True,
        "allreduce_strategy": "NCCL",
    }
    with pytest.raises(CeilingError, match="KEY=VALUE"):
        parse_options(["cuda_graph_config"])


def test_cli_flags(priors_only, capsys, tmp_path: Path):
    argv = ["predict", "--model", "deepseek-v3", "--gpu", "h200", "--tp", "8", "--engine",
            "trtllm", "--trtllm-option", "allreduce_strategy=NCCL", "--json"]  # fmt: skip
    assert main(argv) in (0, None)
    data = json.loads(capsys.readouterr().out)
    assert data["deployment"]["allreduce_impl"] == "nccl"
    rc = main([*argv[:-2], "allreduce_strategy=MNNVL"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("error:") == 1 and "fix:" in err and "Traceback" not in err
