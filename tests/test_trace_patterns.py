"""The kernel-name tables (engines/data/trace/*.yaml): every pattern classifies its example."""

from __future__ import annotations

import pytest

from ceiling.engines.trace_patterns import ENGINES, Classifier, table
from ceiling.trace.split import class_table

CASES = [
    (engine, i, p) for engine in ("generic", *ENGINES) for i, p in enumerate(table(engine).patterns)
]


@pytest.mark.parametrize(
    ("engine", "index", "pattern"), CASES, ids=[f"{e}-{i}" for e, i, _ in CASES]
)
def test_every_pattern_classifies_its_example(engine, index, pattern):
    cls = Classifier(None if engine == "generic" else engine)
    hit = cls.classify(pattern.example)
    assert hit.op_class == pattern.op_class, pattern.example
    assert hit.pattern == pattern.match, f"an earlier pattern took {pattern.example!r}"
    assert hit.table == engine


def test_every_class_is_described_and_every_pattern_cites_a_source():
    described = set(class_table())
    for engine in ("generic", *ENGINES):
        for p in table(engine).patterns:
            assert p.op_class in described
            assert len(p.source) > 10


def test_nccl_algorithm_and_protocol_are_read_from_the_name():
    cls = Classifier(None)
    assert cls.classify("ncclDevKernel_AllReduce_Sum_bf16_TREE_LL128(x)").impl == "nccl_tree_ll128"
    assert cls.classify("ncclKernel_AllReduce_RING_LL_Sum_half(x)").impl == "nccl_ring_ll"
    assert cls.classify("ncclDevKernel_AllReduce_Sum_f32_NVLS_SIMPLE(x)").impl == "nccl_nvls_simple"


def test_engine_tables_come_first_and_unknown_names_stay_unmatched():
    # an engine's own kernel is known through its table only; the Triton fused_moe_kernel,
    # which several engines carry under one name, is generic (issue 37)
    own = "void vllm::moe::moe_sum_vec_kernel<c10::BFloat16, 8>(c10::BFloat16*, long)"
    assert Classifier("vllm").classify(own).op_class == "moe_experts"
    assert Classifier(None).classify(own).op_class == "unmatched"
    assert Classifier(None).classify("fused_moe_kernel").op_class == "moe_experts"
    assert Classifier("vllm").classify("totally_new_kernel<1>").op_class == "unmatched"
    assert Classifier("llama.cpp").engine == "llamacpp"
    assert Classifier("llamacpp-python").engine == "llamacpp"
    assert Classifier("trtllm").engine is None  # no table: generic names only


def test_cudnn_sdpas_reduction_is_attention_and_other_fusion_kernels_are_not():
    """cuDNN's SDPA on the H200 runs a lean_reduction_kernel beside each fprop kernel (about
    1 % of the fixtures' kernel time): attention. cuDNN's other fusion kernels are not, and
    stay unmatched by name."""
    cls = Classifier(None)
    reduction = "void cudnn::fusion::lean_reduction_kernel<false, false, false>(void*, float*)"
    assert cls.classify(reduction).op_class == "attention"
    assert cls.classify(reduction).impl == "cudnn"
    assert cls.classify("void cudnn::fusion::layernorm_fwd_kernel<x>(x)").op_class == "unmatched"
