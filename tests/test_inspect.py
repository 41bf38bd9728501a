"""inspect: engine logs -> EngineFacts and findings; death classification from logs.

Real CPU logs (``*_real.log``) and GPU logs reconstructed from vLLM/SGLang format strings (their
headers say so) live in tests/fixtures/logs/.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ceiling.cli import main
from ceiling.diagnose.logs import inspect_log, parse_config_repr, parse_lines
from ceiling.engines.death import classify_death
from ceiling.errors import CeilingError

LOGS = Path(__file__).parent / "fixtures" / "logs"


def ids(facts) -> set[str]:
    return {f.id for f in facts.findings}


def test_real_cpu_eager_log():
    f = inspect_log(LOGS / "vllm_cpu_0.32_eager_real.log")
    assert (f.engine, f.version, f.v1, f.device) == ("vllm", "0.32.0", True, "cpu")
    assert f.model == "/models/tiny-llama" and f.served_model_name == "tiny"
    assert f.architecture == "LlamaForCausalLM"
    assert f.non_default_args["max_model_len"] == 512
    assert f.non_default_args["enforce_eager"] is True
    assert (f.tensor_parallel_size, f.pipeline_parallel_size, f.data_parallel_size) == (1, 1, 1)
    assert f.enforce_eager is True
    assert f.compilation_mode == "NONE" and f.cudagraph_mode == "NONE"
    assert f.custom_ops == ["all"]
    assert f.fusion_passes["fuse_norm_quant"] is True
    assert f.fusion_passes["fuse_allreduce_rms"] is False
    assert f.enabled_fusions == ["norm_quant", "act_quant"]
    assert f.kv_cache_tokens == 524288 and f.max_concurrency == 1024.0
    assert f.max_concurrency_tokens_per_request == 512
    assert f.kv_cache_memory_gib == 1.0
    assert f.weights_load_s == 0.01 and f.init_engine_s == 0.95
    assert f.ready is True and f.startup_s == 28.0
    assert any("Triton is not installed" in w for w in f.warnings)
    # eager on CPU is only informative; custom allreduce at TP=1 on CPU is not a finding
    eager = next(x for x in f.findings if x.id == "eager-mode")
    assert eager.severity == "info" and eager.evidence
    # on the CPU build enforce_eager turns torch.compile off (no CUDA graphs exist there): no
    # GPU advice, and no CPU advice either until compiling is measured to help this model
    assert eager.fix is None and "torch.compile is off" in eager.title
    assert f.compilation == "eager: torch.compile off (enforce_eager)"
    assert "compiling speeds this model up on the CPU build" in eager.withheld
    assert "custom-allreduce-off" not in ids(f)


def test_real_cpu_compiled_log():
    f = inspect_log(LOGS / "vllm_cpu_0.32_compiled_real.log")
    assert f.enforce_eager is False
    assert f.compilation_mode == "DYNAMO_TRACE_ONCE"
    assert f.compile_cache_hit is False  # "Compiling model again due to a load failure"
    assert any("load failure" in ln for ln in f.evidence["compile_cache"])
    assert f.init_engine_s == 12.39
    assert f.non_default_args["model_tag"] == "/models/tiny-llama"
    # compiled (Dynamo + Inductor), though cudagraph_mode is NONE as on every CPU log
    assert f.compile_backend == "inductor" and f.cudagraph_mode == "NONE"
    assert "eager-mode" not in ids(f)
    assert f.compilation.startswith("torch.compile: Dynamo traces the model once, Inductor")


def test_warm_cache_cpu_compiled_log_is_not_eager(tmp_path):
    """The same real log as a warm start: the AOT-compiled model is loaded from the cache
    (vLLM 0.32 compilation/decorators.py: "%sDirectly load AOT compilation from path %s"),
    vLLM still warns "Inductor compilation was disabled by user settings" (its own pass
    pipeline, any mode but VLLM_COMPILE), and Dynamo + Inductor ran: not eager mode."""
    lines = []
    for ln in (LOGS / "vllm_cpu_0.32_compiled_real.log").read_text().splitlines():
        if "Compiling model again due to a load failure" in ln:
            head, _, _ = ln.partition("[decorators.py")
            ln = (
                head + "[decorators.py:320] [backbone] Directly load AOT compilation from path "
                "<home>/.cache/vllm/torch_compile_cache/torch_aot_compile/3c0c/rank_0_0/model"
            )
        elif "saved AOT compiled function" in ln:
            continue
        lines.append(ln)
    assert any("Inductor compilation was disabled by user settings" in ln for ln in lines)
    log = tmp_path / "warm.log"
    log.write_text("\n".join(lines) + "\n")
    f = inspect_log(log)
    assert f.compile_cache_hit is True and f.enforce_eager is False
    assert "eager-mode" not in ids(f)
    assert "Dynamo" in f.compilation and "Inductor compiles the graph" in f.compilation
    assert f.compilation.endswith("loaded from the compile cache")
    assert "eager" not in f.compilation


def test_gpu_kimi_tp8_pcie_fixture():
    f = inspect_log(LOGS / "vllm_0.11_kimi_tp8_pcie.log")  # ANSI-coloured prefixes
    assert f.version == "0.11.0" and f.device == "cuda"
    assert f.tensor_parallel_size == 8
    assert f.quantization == "compressed-tensors"
    assert f.linear_kernel == "CompressedTensorsWNA16 -> MarlinLinearKernel"
    assert f.moe_kernel == "CompressedTensorsWNA16MarlinMoEMethod"
    assert f.attention_backend == "TRITON_MLA" and f.mla is True
    assert f.compilation_mode == "VLLM_COMPILE"
    assert f.cudagraph_mode == "FULL_AND_PIECEWISE"
    assert f.cudagraph_capture_sizes[-1] == 64 and f.max_cudagraph_capture_size == 64
    assert f.custom_ops == ["none"]
    assert f.compile_cache_hit is True and f.torch_compile_s == 26.31
    assert f.custom_allreduce_disabled is True
    assert "more than two PCIe-only GPUs" in f.custom_allreduce_reason
    assert f.nccl_version == "2.27.3"
    assert f.weights_load_s == 2112.40 and f.model_memory_gib == 71.2345
    assert f.kv_cache_tokens == 231424 and f.max_concurrency == 7.06
    assert f.graph_capture_s == 9 and f.graph_capture_gib == 1.42
    assert f.non_default_args["gpu_memory_utilization"] == 0.92
    assert {"custom-allreduce-off", "slow-restart"} <= ids(f)
    # INT4 weights-only (WNA16 -> Marlin): no activation quantization, so no norm/act + quant
    # fusion advice (there is nothing for those passes to fuse)
    assert not {"quant-fusion-off", "int4-without-fusion"} & ids(f)
    ar = next(x for x in f.findings if x.id == "custom-allreduce-off")
    assert ar.severity == "critical" and ar.kind == "configurable"
    assert all("Custom allreduce is disabled" in ln for ln in ar.evidence)
    assert "\x1b" not in " ".join(ar.evidence)
    # vLLM stops at "PCIe-only" before testing P2P, and 0.11 is not the version ceiling read:
    # the one-shot advice would rest on unknowns, so it is withheld and says why
    assert ar.fix is None and ar.doc == "docs/causes/custom-allreduce-off.md"
    assert "unknown whether GPU peer-to-peer works over PCIe" in ar.withheld
    assert "vLLM 0.11.0; ceiling checked 0.32" in ar.withheld
    slow = next(x for x in f.findings if x.id == "slow-restart")
    assert slow.kind == "fundamental"  # weights loading dominates the restart
    # concurrency above the KV capacity (7.06 full-length requests)
    g = inspect_log(LOGS / "vllm_0.11_kimi_tp8_pcie.log", concurrency=16)
    assert "kv-capacity" in ids(g)
    assert "kv-capacity" not in ids(
        inspect_log(LOGS / "vllm_0.11_kimi_tp8_pcie.log", concurrency=4)
    )


def test_gpu_vllm_010_json_config_fixture():
    f = inspect_log(LOGS / "vllm_0.10_llama70b_json_config.log")
    assert f.version == "0.10.1.1" and f.v1 is True
    assert f.compilation_mode == "VLLM_COMPILE"  # "level": 3
    assert f.cudagraph_mode == "PIECEWISE"  # "use_cudagraph": true
    assert f.fusion_passes == {"enable_fusion": False, "enable_noop": True}
    assert f.max_cudagraph_capture_size == 512
    assert f.compile_cache_hit is False
    assert f.attention_backend == "Flash Attention"  # "Using Flash Attention backend on V1 engine."
    assert f.kv_cache_dtype == "fp8" and f.quantization == "fp8"
    assert {"kv-capacity", "fp8-kv-unavailable", "unknown-env"} <= ids(f)
    kv = next(x for x in f.findings if x.id == "kv-capacity")
    assert "0.99" in kv.title and any("Maximum concurrency" in ln for ln in kv.evidence)


def test_sglang_fixture():
    f = inspect_log(LOGS / "sglang_dsv3_tp8.log")
    assert f.engine == "sglang"
    assert f.tensor_parallel_size == 8 and f.expert_parallel_size == 1
    assert f.attention_backend == "flashinfer" and f.mla is True
    assert f.cudagraph_mode == "FULL" and f.max_cudagraph_capture_size == 160
    assert f.kv_cache_tokens == 412160 and f.kv_cache_memory_gib == 26.99
    assert f.max_concurrency == pytest.approx(412160 / 163840, abs=0.01)
    assert f.graph_capture_s == 43.10 and f.model_memory_gib == 79.90
    assert f.ready is True and f.startup_s == 580.0
    assert f.non_default_args["mem_fraction_static"] == 0.88


def test_line_prefix_variants_parse_alike():
    body = "INFO 05-12 10:36:41 [kv_cache_utils.py:1087] GPU KV cache size: 1,234 tokens"
    for prefix in ("", "(EngineCore_DP0 pid=12) ", "\x1b[1;36m(EngineCore pid=9)\x1b[0;0m "):
        assert parse_lines([prefix + body], engine="vllm").kv_cache_tokens == 1234


def test_config_repr_both_formats():
    assert parse_config_repr('{"level": 3, "use_cudagraph": true}') == {
        "level": 3,
        "use_cudagraph": True,
    }
    repr_cfg = "{'mode': <CompilationMode.VLLM_COMPILE: 3>, 'x': 0.92, 'y': [1, 2], 'z': None}"
    assert parse_config_repr(repr_cfg) == {
        "mode": "VLLM_COMPILE",
        "x": 0.92,
        "y": [1, 2],
        "z": None,
    }


def test_unrecognisable_log_and_missing_file(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("hello\nworld\n")
    with pytest.raises(CeilingError, match="which engine"):
        inspect_log(p)
    with pytest.raises(CeilingError, match="not found"):
        inspect_log(tmp_path / "nope.log")


def test_cli_inspect_json(capsys):
    assert main(["inspect", "--json", str(LOGS / "vllm_0.11_kimi_tp8_pcie.log")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema_version"] == 1 and data["tensor_parallel_size"] == 8
    assert {f["id"] for f in data["findings"]} >= {"custom-allreduce-off"}


# ---- death classification ---------------------------------------------------------------


def test_real_argparse_death():
    lines = (LOGS / "vllm_cpu_0.32_num_scheduler_steps_real.log").read_text().splitlines()
    d = classify_death(lines, exit_code=2, engine="vllm")
    assert d.cause == "argparse unrecognized arguments"
    assert any("--num-scheduler-steps 10" in ln for ln in d.evidence)
    assert "preflight" in d.fix


@pytest.mark.parametrize(
    "line, cause",
    [
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "CUDA OOM while loading",
        ),
        (
            "ValueError: To serve at least one request with the models's max seq len (131072), "
            "(16.00 GiB KV cache is needed, which is larger than the available KV cache memory "
            "(9.87 GiB). Based on the available memory, the estimated maximum model length is 80000. "
            "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
            "initializing the engine.",
            "KV cache too small for max model len",
        ),
        (
            "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)",
            "NCCL error",
        ),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "CUDA error"),
        ("OSError: [Errno 98] Address already in use", "port in use"),
        (
            "RuntimeError: unable to write to file </torch_123_456_0>: No space left on device (28) in /dev/shm",
            "/dev/shm too small",
        ),
        (
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
            "engine core failed",
        ),
        (
            "vllm: error: argument --dtype: invalid choice: 'fp32' (choose from auto, half)",
            "argparse invalid value",
        ),
    ],
)
def test_death_causes(line, cause):
    d = classify_death(["INFO starting", line, "more"], exit_code=1, engine="vllm")
    assert d.cause == cause
    assert any(line[:30] in ev for ev in d.evidence)


def test_specific_cause_wins_over_engine_core_failed():
    lines = [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB",
        "RuntimeError: Engine core initialization failed. See root cause above.",
    ]
    assert classify_death(lines, 1).cause == "CUDA OOM while loading"


def test_unknown_death_quotes_the_tail():
    d = classify_death(["a", "b", "", "c"], exit_code=-9)
    assert d.cause.startswith("unknown") and "signal 9" in d.cause
    assert d.evidence == ["a", "b", "c"]


@pytest.mark.parametrize(
    "msg, backend",
    [
        (
            "Using FLASHINFER_CUTLASS Fp8 MoE backend out of potential backends: ['A', 'B'].",
            "FLASHINFER_CUTLASS Fp8",
        ),
        (
            "Using 'flashinfer_cutlass' NvFp4 MoE backend out of potential backends: [...]",
            "flashinfer_cutlass NvFp4",
        ),
        ("Using TritonExperts MoE backend", "TritonExperts"),
    ],
)
def test_moe_backend_lines(msg, backend):
    line = f"(Worker_TP0 pid=5) INFO 05-12 10:00:47 [oracle.py:1] {msg}"
    facts = parse_lines([line], engine="vllm")
    assert facts.moe_backend == backend
    assert facts.attention_backend is None  # a MoE backend is not an attention backend


def test_sglang_line_variants():
    lines = [
        "[2025-11-04 05:20:00] server_args=ServerArgs(model_path='m', tp_size=2, ep_size=2)",
        "[2025-11-04 05:27:13 DP0 TP0 EP0] Load weight end. elapsed=23.18 s, type=Glm4MoeLiteForCausalLM, avail mem=32.02 GB, mem usage=28.79 GB.",
        "[2025-11-04 05:27:14 DP0 TP0 EP0] KV Cache is allocated. #tokens: 350257, K size: 0.21 GB, V size: 0.21 GB",
        "[2025-11-04 05:27:20] The server is fired up and ready to roll!",
    ]
    f = parse_lines(lines)
    assert f.engine == "sglang" and f.expert_parallel is True and f.expert_parallel_size == 2
    assert f.weights_load_s == 23.18 and f.model_memory_gib == 28.79
    assert f.architecture == "Glm4MoeLiteForCausalLM"
    assert f.kv_cache_tokens == 350257 and f.kv_cache_memory_gib == 0.42
    assert f.ready and f.startup_s == 440.0


def test_init_line_with_compilation_time():
    line = (
        "(EngineCore pid=7) INFO 11-29 09:00:01 [core.py:396] init engine (profile, create kv "
        "cache, warmup model) took 61.20 s (compilation: 38.50 s)"
    )
    f = parse_lines([line], engine="vllm")
    assert f.init_engine_s == 61.2 and f.torch_compile_s == 38.5


@pytest.mark.parametrize(
    "msg, backend, mla",
    [
        (
            "Using TRITON_MLA attention backend out of potential backends: ['TRITON_MLA'].",
            "TRITON_MLA",
            True,
        ),
        ("Using Triton MLA backend on V1 engine.", "Triton MLA", True),
        ("Using FlashMLA backend on V1 engine.", "FlashMLA", True),
        ("Using Flash Attention backend on V1 engine.", "Flash Attention", False),
        ("Using AttentionBackendEnum.FLASHINFER backend.", "FLASHINFER", False),
        ("Using CPU_MLA backend.", "CPU_MLA", True),
    ],
)
def test_attention_backend_lines(msg, backend, mla):
    f = parse_lines([f"INFO 05-12 10:00:46 [cuda.py:1] {msg}"], engine="vllm")
    assert f.attention_backend == backend and bool(f.mla) is mla


def test_finding_fixes_speak_the_engines_flags():
    """The same finding is fixed with each engine's own flags (engine knowledge lives in the
    adapters): a llama.cpp user must not be told to raise --gpu-memory-utilization."""
    from ceiling.diagnose.findings import derive_findings
    from ceiling.diagnose.logs import EngineFacts
    from ceiling.engines import get_engine

    def kv_fix(engine):
        facts = EngineFacts(engine=engine, max_concurrency=1.0)
        fixes = get_engine(engine).finding_fixes if engine else None
        found = derive_findings(facts, concurrency=4, fixes=fixes)
        return next(f.fix for f in found if f.id == "kv-capacity")

    assert "--gpu-memory-utilization" in kv_fix("vllm")
    assert "--mem-fraction-static" in kv_fix("sglang")
    assert "--n_ctx" in kv_fix("llamacpp-python") and "gpu-memory" not in kv_fix("llamacpp-python")
    assert "--ctx-size" in kv_fix("llamacpp") and "--parallel" in kv_fix("llamacpp")
    assert kv_fix(None).startswith("more KV") and "--" not in kv_fix(None)  # neutral advice
