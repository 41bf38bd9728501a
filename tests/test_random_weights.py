"""A server told to load random weights (``--load-format dummy``) is measured without a flag:
the sanity gate's "broken" is expected, and the report says "random weights: timing only"."""

from __future__ import annotations

from ceiling.diagnose.facts import EngineFacts
from ceiling.diagnose.schema import DoctorResult
from ceiling.engines import get_engine
from ceiling.engines.variant import Arg, Variant
from ceiling.flows.doctor_checks import random_weights as _random_weights


def test_the_variants_load_format_names_random_weights():
    vllm = get_engine("vllm")
    why = vllm.random_weights(["--load-format", "dummy", "--max-model-len", "4096"], {})
    assert why is not None and "random weights" in why and "timing only" in why
    assert "the variant" in why
    assert vllm.random_weights(["--load-format=dummy"], {}) is not None
    assert vllm.random_weights(["--load-format", "safetensors"], {}) is None
    assert vllm.random_weights([], {}) is None


def test_the_start_up_logs_arguments_name_random_weights():
    why = get_engine("sglang").random_weights([], {"load_format": "dummy"})
    assert why is not None and "start-up log" in why
    assert get_engine("vllm").random_weights([], {"load_format": "auto"}) is None


def test_llamacpp_has_no_dummy_load_format():
    assert get_engine("llamacpp").random_weights(["--load-format", "dummy"], {}) is None


def test_the_doctor_reads_either_the_variant_or_the_log():
    res = DoctorResult()
    res.target.engine = "vllm"
    variant = Variant(
        name="v", engine="vllm", model="/m", args=[Arg(flag="--load-format", values=["dummy"])]
    )
    assert _random_weights(res, variant) is not None
    res.facts = EngineFacts(non_default_args={"load_format": "dummy"})
    assert _random_weights(res, None) is not None
    res.facts = EngineFacts(non_default_args={})
    assert _random_weights(res, None) is None
    res.target.engine = "not-an-engine"
    assert _random_weights(res, None) is None
