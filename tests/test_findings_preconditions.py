"""Findings give no advice whose precondition is false, and say so when one is unknown.

Checked on every log under tests/fixtures/logs (the real CPU logs, the reconstructed GPU ones:
vLLM 0.32 BF16/FP8/NVFP4/W4A16 on H200 and B200, vLLM 0.10/0.11, SGLang), each read as if it
came from an unknown GPU, an H200, a B200 and an RTX PRO 6000; and on edits of those logs that
switch on the settings the rules react to (custom ops, fusion passes off, a lowered CUDA-graph
mode), so that every rule meets both its true and its false preconditions.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ceiling.diagnose.findings import Finding, FindingContext, context_for
from ceiling.diagnose.logs import inspect_log, parse_lines
from ceiling.spec.hardware import GpuHardware

LOGS = Path(__file__).parent / "fixtures" / "logs"
# every start-up log (the num_scheduler_steps one died parsing its arguments: no findings)
ALL = sorted(p for p in LOGS.glob("*.log") if "num_scheduler_steps" not in p.name)
GPU_032 = sorted(LOGS.glob("vllm_0.32_gpu_*.log"))
CONTEXTS = {
    "unknown": FindingContext(concurrency=64),
    "h200": context_for(GpuHardware(name="h200"), concurrency=64),
    "b200": context_for(GpuHardware(name="b200"), concurrency=64),
    "rtx-pro-6000": context_for(GpuHardware(name="rtx-pro-6000"), concurrency=64),
}


def assert_truthful(f: Finding) -> None:
    """The invariant: advice only on facts that hold; unknown ones are said, never assumed."""
    if f.fix is None:
        return
    for p in f.preconditions:
        assert p.holds is not False, f"{f.id} advises although {p.fact!r} is false: {f.fix}"
        if p.holds is None:  # only as an explicit condition inside the advice
            assert f"if {p.fact}" in f.fix, f"{f.id} advises on an unknown: {p.fact!r}"
    assert f.doc and f.doc.startswith("docs/causes/")
    assert not re.search(
        r"shared/|throughput-killers|design\.md", f.fix + (f.predicted_effect or "")
    )


@pytest.mark.parametrize("log", ALL, ids=lambda p: p.name)
@pytest.mark.parametrize("ctx", list(CONTEXTS), ids=str)
def test_no_fixture_gets_advice_on_a_false_precondition(log, ctx):
    facts = inspect_log(log, context=CONTEXTS[ctx])
    for f in facts.findings:
        assert_truthful(f)
        if f.fix is None and f.preconditions and any(p.holds is None for p in f.preconditions):
            assert f.withheld and "unknown whether" in f.withheld  # it says what is missing


def _edit(log: Path, *subs: tuple[str, str]) -> list[str]:
    text = log.read_text()
    for old, new in subs:
        assert old in text, (log.name, old)
        text = text.replace(old, new)
    return text.splitlines()


CUSTOM_OPS = ("'custom_ops': ['none']", "'custom_ops': ['+rms_norm', '+silu_and_mul']")
NO_ACT = ("'fuse_act_quant': True", "'fuse_act_quant': False")
NO_AR_FUSION = ("'fuse_allreduce_rms': True", "'fuse_allreduce_rms': False")


def _ids(facts) -> dict[str, Finding]:
    return {f.id: f for f in facts.findings}


@pytest.mark.parametrize("fmt", ["w4a16", "bf16"])
@pytest.mark.parametrize("gpu", ["h200", "b200"])
def test_no_quant_fusion_advice_without_activation_quantization(fmt, gpu):
    """W4A16 (Machete/Marlin) and BF16 quantize no activations: even with the norm/activation
    as custom ops and both passes off, there is nothing for the passes to fuse."""
    log = LOGS / f"vllm_0.32_gpu_{fmt}_{gpu}.log"
    facts = parse_lines(_edit(log, CUSTOM_OPS), context=CONTEXTS[gpu])
    assert facts.fusion_passes["fuse_norm_quant"] is False
    assert "quant-fusion-off" not in _ids(facts)


def test_nvfp4_on_hopper_runs_weight_only_so_no_fusion_advice():
    log = LOGS / "vllm_0.32_gpu_nvfp4_h200.log"
    facts = parse_lines(_edit(log, CUSTOM_OPS, NO_ACT), context=CONTEXTS["h200"])
    by = _ids(facts)
    assert facts.weight_only_fallback == "FP4"
    assert "quant-fusion-off" not in by  # Marlin: FP4 weights, 16-bit activations
    wo = by["weight-only-fallback"]
    assert wo.kind == "fundamental" and wo.fix is None
    assert "native-format checkpoint" in wo.withheld


def test_fp8_norm_fusion_advised_only_with_custom_ops():
    """FP8 W8A8: with native ops (the default) Inductor fuses norm + quant itself and vLLM
    leaves the pass off on purpose: no finding. With the norm as a custom op the pass is what
    fuses: advised. The SiLU + quant pass needs static FP8 scales, unknown from the log: the
    finding says so instead of advising it."""
    log = LOGS / "vllm_0.32_gpu_fp8_h200.log"
    assert "quant-fusion-off" not in _ids(inspect_log(log, context=CONTEXTS["h200"]))
    f = _ids(parse_lines(_edit(log, CUSTOM_OPS), engine="vllm", context=CONTEXTS["h200"]))[
        "quant-fusion-off"
    ]
    assert f.fix and "fuse_norm_quant=true" in f.fix and "fuse_act_quant" not in f.fix
    assert all(p.holds for p in f.preconditions)


def test_nvfp4_on_blackwell_act_fusion_advised_norm_fusion_withheld():
    log = LOGS / "vllm_0.32_gpu_nvfp4_b200.log"
    f = _ids(parse_lines(_edit(log, NO_ACT), context=CONTEXTS["b200"]))["quant-fusion-off"]
    assert "fuse_act_quant=true" in f.fix  # FP4 quant is always a custom op: the pass fuses it
    # the norm + NVFP4 pattern needs FlashInfer's add_rmsnorm_fp4quant, which no log shows
    norm_only = _ids(parse_lines(log.read_text().splitlines(), context=CONTEXTS["b200"]))
    g = norm_only["quant-fusion-off"]
    assert g.fix is None and "add_rmsnorm_fp4quant" in g.withheld
    # on an unknown GPU the capability is missing too
    h = _ids(inspect_log(log))["quant-fusion-off"]
    assert "compute capability >= 10.0" in h.withheld


@pytest.mark.parametrize(
    ("gpu", "expect"),
    [("rtx-pro-6000", None), ("b200", "advice"), ("h200", "withheld"), ("unknown", "withheld")],
)
def test_allreduce_fusion_follows_the_compute_capability(gpu, expect):
    """FlashInfer's allreduce + RMSNorm fusion exists for 9.0 and 10.x only."""
    name = "vllm_0.32_gpu_bf16_b200.log" if gpu != "h200" else "vllm_0.32_gpu_bf16_h200.log"
    facts = parse_lines(_edit(LOGS / name, NO_AR_FUSION), engine="vllm", context=CONTEXTS[gpu])
    f = _ids(facts).get("allreduce-fusion-off")
    if expect is None:
        assert f is None  # 12.0: the fused kernel does not exist, nothing to turn on
    elif expect == "advice":  # B200 log with FlashInfer attention: FlashInfer is installed
        assert f.fix and "fuse_allreduce_rms=true" in f.fix
    else:
        assert f.fix is None and "unknown whether" in f.withheld


def test_cudagraph_downgrade_only_counts_when_decode_loses_full_graphs():
    log = LOGS / "vllm_0.32_gpu_bf16_b200.log"
    anchor = "(Worker_TP0 pid=3230) INFO 05-20 09:10:06 [pynccl.py:148]"
    mixed = (
        "(EngineCore pid=3188) WARNING 05-20 09:10:07 [compilation.py:1411] CUDAGraphMode."
        "FULL_AND_PIECEWISE is not supported with FLASHINFER backend (support: "
        "AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE); setting cudagraph_mode=FULL_DECODE_ONLY"
    )
    decode = (
        "(EngineCore pid=3188) WARNING 05-20 09:10:07 [compilation.py:1437] CUDAGraphMode."
        "FULL_AND_PIECEWISE is not supported with TRITON_MLA backend (support: "
        "AttentionCGSupport.NEVER); setting cudagraph_mode=PIECEWISE because attention is "
        "compiled piecewise"
    )
    kept = _ids(parse_lines(_edit(log, (anchor, mixed + "\n" + anchor))))
    assert "partial-cudagraphs" not in kept  # decode still runs as one full graph
    lost = _ids(parse_lines(_edit(log, (anchor, decode + "\n" + anchor))))["partial-cudagraphs"]
    assert lost.fix is None and "another attention backend supports full graphs" in lost.withheld


def test_kv_remedies_are_offered_only_where_they_can_help():
    """An FP8 KV cache is not offered when the cache is FP8 already; a shorter max length
    only as a condition while the request length is unknown, plainly once it is known."""
    log = LOGS / "vllm_0.10_llama70b_json_config.log"  # kv_cache_dtype fp8, 0.99x
    f = _ids(inspect_log(log, concurrency=4))["kv-capacity"]
    assert "fp8" not in f.fix.lower()
    assert "(if the maximum length exceeds what a request needs" in f.fix
    known = _ids(inspect_log(log, context=FindingContext(concurrency=4, request_tokens=2048)))[
        "kv-capacity"
    ]
    assert "a lower --max-model-len" not in known.fix or "(if" not in known.fix
    assert_truthful(known)


def test_custom_allreduce_reasons_decide_the_advice():
    kimi = LOGS / "vllm_0.11_kimi_tp8_pcie.log"
    p2p = (
        "it's not supported on more than two PCIe-only GPUs",
        "your platform lacks GPU P2P capability or P2P test failed",
    )
    f = _ids(parse_lines(_edit(kimi, p2p)))["custom-allreduce-off"]
    assert "restore GPU peer-to-peer" in f.fix  # a one-shot kernel cannot help without P2P
    world = (
        "because it's not supported on more than two PCIe-only GPUs",
        "due to an unsupported world size: 8",
    )
    g = _ids(parse_lines(_edit(kimi, world)))["custom-allreduce-off"]
    assert g.fix is None and g.severity == "info" and g.kind == "fundamental"
    # PCIe-only at TP=8 on 0.32 with P2P probed: the opt-in FlashInfer one-shot is advised
    lines = _edit(kimi, ("v0.11.0", "v0.32.0"), ("version 0.11.0", "version 0.32.0"))
    ctx = FindingContext(p2p=True)
    h = _ids(parse_lines(lines, context=ctx))["custom-allreduce-off"]
    assert h.fix and "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1" in h.fix
    assert_truthful(h)


def test_concurrency_cap_and_expert_parallel_on_pcie():
    log = LOGS / "vllm_0.11_kimi_tp8_pcie.log"
    lines = _edit(
        log,
        ("'gpu_memory_utilization': 0.92,", "'gpu_memory_utilization': 0.92, 'max_num_seqs': 8, "
         "'enable_expert_parallel': True,"),
    )  # fmt: skip
    by = _ids(parse_lines(lines, context=FindingContext(concurrency=32)))
    cap = by["concurrency-cap"]
    assert cap.severity == "critical" and "8 sequences" in cap.title
    # the KV cache holds 7.06 of 32 requests: raising the cap alone cannot serve 32
    assert cap.fix is None and "KV cache holds the intended concurrency" in cap.withheld
    ep = by["expert-parallel-pcie"]  # PCIe-only is in vLLM's own custom-allreduce line
    assert ep.fix == "drop --enable-expert-parallel (experts sharded by TP)"
    nv = _ids(parse_lines(_edit(log, ("'gpu_memory_utilization': 0.92,", "'gpu_memory_utilization': 0.92, 'enable_expert_parallel': True,"), ("it's not supported on more than two PCIe-only GPUs", "of missing custom allreduce library")), context=FindingContext(interconnect="nvlink")))  # fmt: skip
    assert "expert-parallel-pcie" not in nv  # on NVLink EP is the usual choice


def test_speculative_decoding_acceptance_from_the_metrics_line():
    log = LOGS / "vllm_0.32_gpu_bf16_h200.log"
    line = (
        "(APIServer pid=3100) INFO 05-20 09:12:40 [metrics.py:121] SpecDecoding metrics: Mean "
        "acceptance length: 1.31, Accepted throughput: 20.15 tokens/s, Drafted throughput: "
        "195.00 tokens/s, Accepted: 403 tokens, Drafted: 3900 tokens, Per-position acceptance "
        "rate: 0.214, 0.061, 0.025, Avg Draft acceptance rate: 10.3%"
    )
    lines = [*log.read_text().splitlines(), line]
    f = _ids(parse_lines(lines, engine="vllm"))["spec-decode-acceptance"]
    assert "1.31" in f.title and "num_speculative_tokens" in f.fix
    good = [*log.read_text().splitlines(), line.replace("length: 1.31", "length: 2.80")]
    assert "spec-decode-acceptance" not in _ids(parse_lines(good))


def test_finding_texts_point_to_project_docs_that_exist():
    root = Path(__file__).resolve().parents[1]
    seen = set()
    for log in ALL:
        for ctx in CONTEXTS.values():
            for f in inspect_log(log, context=ctx).findings:
                assert f.doc, f.id
                seen.add(f.doc)
    for doc in seen:
        assert (root / doc).is_file(), doc
