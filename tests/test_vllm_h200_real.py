"""What vLLM 0.25.0 showed on a real H200 (experiments/results/2026-12-06_h200-vllm): its
start-up logs and trimmed profiler traces, kept as fixtures so CI holds what the GPU showed.
Llama-3.1-8B and Qwen3-30B-A3B with random weights (--load-format dummy), CUDA graphs on."""

from __future__ import annotations

from pathlib import Path

import pytest

from ceiling.diagnose.logs import inspect_log
from ceiling.engines import get_engine
from ceiling.engines.logparse import parse_config_repr
from ceiling.engines.trace_patterns import Classifier, guess_engine
from ceiling.trace import read_trace, split

FIX = Path(__file__).parent / "fixtures"
LLAMA_LOG = FIX / "logs" / "vllm_0.25_h200_llama8b_dummy_real.log"
MOE_LOG = FIX / "logs" / "vllm_0.25_h200_qwen30a3b_dummy_real.log"
FP8_LOG = FIX / "logs" / "vllm_0.25_h200_qwen32fp8_deepgemm_warmup_real.log"
LLAMA_TRACE = FIX / "trace" / "vllm-0.25-h200-llama-3.1-8b-b1-rank0.pt.trace.json.gz"
MOE_TRACE = FIX / "trace" / "vllm-0.25-h200-qwen3-30b-a3b-b1-stack-rank0.pt.trace.json.gz"


def test_inspect_reads_the_facts_of_a_real_cuda_start_up():
    f = inspect_log(LLAMA_LOG)
    assert (f.engine, f.version, f.device) == ("vllm", "0.25.0", "cuda")
    assert f.attention_backend == "FLASH_ATTN"
    assert f.compilation_mode == "VLLM_COMPILE" and f.torch_compile_s == pytest.approx(19.83)
    assert f.cudagraph_mode == "FULL_AND_PIECEWISE" and f.enforce_eager is False
    assert len(f.cudagraph_capture_sizes) == 51 and f.max_cudagraph_capture_size == 512
    assert f.kv_cache_tokens == 896912 and f.kv_cache_memory_gib == pytest.approx(109.49)
    assert f.model_memory_gib == pytest.approx(15.0) and f.ready


def test_the_non_default_args_with_an_object_repr_are_read():
    """0.25 prints ``'profiler_config': ProfilerConfig(...)`` inside the dict: the line was
    read as nothing, so the dummy load format went unseen and the sanity gate stopped the
    doctor on a server whose random weights the log announced."""
    f = inspect_log(LLAMA_LOG)
    args = f.non_default_args
    assert args["load_format"] == "dummy" and args["max_model_len"] == 4096
    assert str(args["profiler_config"]).startswith("ProfilerConfig(")
    assert get_engine("vllm").random_weights([], args) is not None
    parsed = parse_config_repr("{'a': 1, 'cfg': Thing(x=1, y='z'), 'l': [Other(), 2], 'n': -3}")
    assert parsed == {"a": 1, "cfg": "Thing(x=1, y='z')", "l": ["Other()", 2], "n": -3}


def test_the_fp8_start_up_reads_its_deepgemm_kernels_and_that_it_never_got_ready():
    f = inspect_log(FP8_LOG)
    assert f.quantization == "fp8" and "DeepGemm" in (f.linear_kernel or "")
    assert f.ready is False


@pytest.mark.parametrize("trace", [LLAMA_TRACE, MOE_TRACE], ids=["llama-8b", "qwen3-30b-a3b"])
def test_every_kernel_of_the_real_traces_is_classified_without_naming_the_engine(trace):
    sp = split([read_trace(trace)], None)
    assert sp.engine == "vllm"  # named by its kernels and step annotations
    assert any("from the trace's kernel and annotation names" in n for n in sp.notes)
    assert sp.coverage >= 0.95, [u.name for u in sp.unmatched]
    assert sp.step_source.startswith("vLLM execute_context")
    # per step, the classes and the idle time make up the step
    total = sum(c.ms for c in sp.classes) + sp.idle_ms
    assert total == pytest.approx(sp.step_ms, rel=1e-3)


def test_the_moe_trace_reads_its_experts():
    sp = split([read_trace(MOE_TRACE)], None)
    experts = next(c for c in sp.classes if c.op_class == "moe_experts")
    assert experts.ms > 0.5  # the Triton fused_moe_kernel: 1.2 ms of a 5.8 ms step
    assert any(c.op_class == "moe_topk" for c in sp.classes)


@pytest.mark.parametrize("engine", [None, "vllm", "sglang", "llamacpp"])
def test_engine_agnostic_kernels_are_known_whatever_engine_the_trace_names(engine):
    cls = Classifier(engine)
    assert cls.classify("fused_moe_kernel").op_class == "moe_experts"
    assert cls.classify("nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT").op_class.startswith("gemm")
    fa3 = (
        "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::"
        "CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>>, 128, cutlass::bfloat16_t>>>>(...)"
    )
    assert cls.classify(fa3).op_class == "attention"
    combine = (
        "void cutlass::device_kernel<flash::FlashAttnFwdCombine<cute::tuple<cute::C<8>, "
        "cute::C<128> >, 5, 256, 1, false, true, cutlass::bfloat16_t, float>>(...)"
    )
    assert cls.classify(combine).op_class == "attention"
    assert cls.classify("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)").op_class == "allreduce"


def test_the_engine_guess_needs_names_of_one_engine():
    assert guess_engine({"nvjet_sm90_tst_64x8", "fused_moe_kernel"}) is None  # shared only
    assert guess_engine({"_prepare_pos_seq_lens_kernel"}) == "vllm"


def test_doctor_url_reads_the_trace_where_the_server_was_told_to_write(tmp_path):
    """doctor --url --trace against the real server looked under its own out-dir while vLLM
    wrote where its --profiler-config said (no file in 60 s): the log names that directory."""
    from ceiling.diagnose.schema import DoctorConfig
    from ceiling.flows.doctor_trace import unlaunched_setup

    args = inspect_log(LLAMA_LOG).non_default_args
    cfg = DoctorConfig(url="http://127.0.0.1:8000", trace=True)
    setup = unlaunched_setup("vllm", cfg, tmp_path, None, args)
    assert setup.trace_dir == "/tmp/vrun/llama8b/trace"
    assert any("from its log" in n for n in setup.notes)
    assert unlaunched_setup("vllm", cfg, tmp_path, None, {}).trace_dir.startswith(str(tmp_path))
    dict_form = {"profiler_config": {"profiler": "torch", "torch_profiler_dir": "/t"}}
    assert get_engine("vllm").profiler_dir_of(dict_form) == "/t"


def test_the_deepgemm_warm_up_is_read_from_its_progress_bar_and_named():
    """Qwen3-32B-FP8 on the H200 never got ready: DeepGEMM compiled 1,155 shapes at ~1 s each.
    The log's progress bar says how long; the finding names the cost and the setting."""
    f = inspect_log(FP8_LOG)
    assert (f.warmup, f.warmup_shapes, f.warmup_done) == ("DeepGEMM warm-up", 1155, 394)
    assert f.warmup_eta_s == pytest.approx(106 + 544)  # [01:46<09:04]
    [w] = [x for x in f.findings if x.id == "startup-warmup"]
    assert "1155 kernel shapes" in w.title and "VLLM_DEEP_GEMM_WARMUP=skip" in (w.fix or "")
    assert len(w.evidence) == 1 and "394/1155" in w.evidence[0]
    assert not [x for x in inspect_log(LLAMA_LOG).findings if x.id == "startup-warmup"]
