"""Finding rules about torch.compile, fusion passes and CUDA graphs (B1-B3). Same contract as
``rules.py``: each rule says what its advice needs, what rules it out, and what was read in the
engines' source.
"""

from __future__ import annotations

from ceiling.diagnose.facts import EngineFacts
from ceiling.diagnose.finding_types import Finding, FindingContext, Precondition, decide, doc_path
from ceiling.diagnose.rules import (
    PROBE_HINT,
    Rule,
    activation_quant,
    capability,
    custom_allreduce_off,
    engine_fix,
    flashinfer_in_use,
    on_gpu,
)

# ---- B3: torch.compile and fusion passes ---------------------------------------------------


def compile_off(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
    """B3. Trigger: compilation mode NONE on a GPU while CUDA graphs are not off by
    ``enforce_eager`` (that case is ``eager-mode``).

    Needs: a GPU (vLLM's fusion passes and piecewise graphs need VLLM_COMPILE).
    Ruled out by: CPU (then ``eager-mode`` speaks for torch.compile), eager mode.
    Checked: vLLM 0.32 config/vllm.py (``OPTIMIZATION_LEVEL_00``..``03``, enforce_eager sets
    ``CompilationMode.NONE`` and ``CUDAGraphMode.NONE``), compilation/passes/pass_manager.py.
    """
    if facts.compilation_mode not in ("NONE", "0") or facts.enforce_eager:
        return None
    f = Finding(
        id="compile-off",
        title="torch.compile is off (compilation mode NONE): no fusion passes, no piecewise graphs",
        severity="warning",
        evidence=facts.evidence.get("compilation", [])[:1],
        predicted_effect="every fusion pass (norm+quant, activation+quant, allreduce+norm) and "
        "piecewise CUDA graphs are lost; more kernels per layer",
        doc=doc_path("compile-off"),
    )
    return decide(
        f,
        [on_gpu(facts)],
        engine_fix(ctx, "compile-off", "turn compilation back on (optimization level 2 or 3)"),
    )


def quant_fusion_off(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
    """B3. Trigger: compiled (VLLM_COMPILE) with ``fuse_norm_quant`` or ``fuse_act_quant``
    false. Each pass is judged on its own; only the ones that could fuse something here count.

    Needs, ``fuse_norm_quant``: FP8 activations with RMSNorm or the FP8 quant as *custom ops*
    (with Inductor's native ops, Inductor fuses them itself and vLLM leaves the pass off on
    purpose); or NVFP4 activations on compute capability >= 10.0 with FlashInfer's
    ``add_rmsnorm_fp4quant`` (the only NVFP4 pattern).
    Needs, ``fuse_act_quant``: NVFP4 activations (FP4 quant is always a custom op); or FP8
    activations quantized statically per tensor or per block (there is no SiLU-and-mul pattern
    for dynamic per-token FP8) with SiLU-and-mul or the FP8 quant as custom ops.
    Ruled out by: weights-only schemes (W4A16 Marlin/Machete, AWQ, GPTQ, compressed-tensors
    WNA16, FP8/NVFP4 run weight-only through Marlin): no activation quantization, nothing to
    fuse; INT8 W8A8 (no INT8 pattern); unquantized models; eager / compilation NONE.
    Checked: vLLM 0.32 compilation/passes/fusion/rms_quant_fusion.py (``QUANT_OPS``;
    ``RMSNormQuantFusionPass.__init__``: FP8 static, dynamic per-token and group patterns, the
    NVFP4 one only with ``_FLASHINFER_NVFP4_RMS_QUANT_OP`` and capability >= 100, epsilons
    1e-5/1e-6), act_quant_fusion.py (``FUSED_OPS``: FP8 static per-tensor, FP8 per-block,
    NVFP4), config/vllm.py (``enable_norm_fusion``/``enable_act_fusion``: custom ops
    rms_norm/silu_and_mul/quant_fp8, or an NVFP4 model), compilation/passes/pass_manager.py.
    """
    passes = facts.fusion_passes or {}
    off = [k for k in ("fuse_norm_quant", "fuse_act_quant") if passes.get(k) is False]
    if facts.compilation_mode != "VLLM_COMPILE" or not off or facts.enforce_eager:
        return None
    act, why = activation_quant(facts)
    ops = facts.custom_ops
    quant = Precondition(
        fact="activations are quantized to FP8 or NVFP4 (what the passes fuse into)",
        holds=None if act is None else act in ("fp8", "nvfp4"),
        because=why,
    )
    if quant.holds is False:
        return None  # weights-only, INT8 or unquantized: nothing for either pass to fuse

    def custom(*names: str) -> Precondition:
        on = None if ops is None else any(o in ("all", *(f"+{n}" for n in names)) for o in ops)
        return Precondition(
            fact=f"{' or '.join(names)} run as custom ops (else Inductor fuses them itself)",
            holds=on,
            because=f"custom_ops {ops}" if ops is not None else "custom_ops not in the log",
        )

    cap, cap_why = capability(ctx)
    per_pass: dict[str, list[Precondition]] = {}
    if "fuse_norm_quant" in off:
        if act == "nvfp4":
            per_pass["fuse_norm_quant"] = [
                Precondition(
                    fact="compute capability >= 10.0 (the NVFP4 norm+quant pattern)",
                    holds=None if cap is None else cap >= 10.0,
                    because=cap_why,
                ),
                Precondition(
                    fact="FlashInfer has add_rmsnorm_fp4quant",
                    holds=None,
                    because="the log does not say which FlashInfer ops exist",
                ),
            ]
        else:
            per_pass["fuse_norm_quant"] = [custom("rms_norm", "quant_fp8")]
    if "fuse_act_quant" in off:
        if act == "nvfp4":
            per_pass["fuse_act_quant"] = []
        else:
            per_pass["fuse_act_quant"] = [
                custom("silu_and_mul", "quant_fp8"),
                Precondition(
                    fact="FP8 activations are scaled statically per tensor or per block (no "
                    "pattern exists for dynamic per-token FP8)",
                    holds=None,
                    because="the activation scheme is in the checkpoint's config, not the log",
                ),
            ]
    live = {k: v for k, v in per_pass.items() if not any(p.holds is False for p in v)}
    if not live:
        return None
    f = Finding(
        id="quant-fusion-off",
        title=f"Norm/activation + quantization fusion is off ({', '.join(live)})",
        severity="warning",
        evidence=facts.evidence.get("compilation", [])[:1]
        + facts.evidence.get("linear_kernel", [])[:2],
        predicted_effect="an extra read and write of the activations per quantized GEMM input, "
        "every layer",
        doc=doc_path("quant-fusion-off"),
    )
    ready = [k for k, v in live.items() if all(p.holds for p in v)]
    pre = [on_gpu(facts), quant] + [p for v in live.values() for p in v]
    if ready:  # advise the passes whose preconditions all hold, list the others' unknowns
        pre = [on_gpu(facts), quant] + [p for k in ready for p in live[k]]
    fix = "; ".join(engine_fix(ctx, f"quant-fusion-off.{k}", f"turn {k} on") for k in ready)
    return decide(f, pre, fix or None, "The page says where each fact can be read.")


def allreduce_fusion_off(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
    """B3. Trigger: TP > 1, compiled, ``fuse_allreduce_rms`` false (or the engine logged that
    the AllReduce fusion pass is disabled).

    Needs: compute capability 9.0 or 10.x (vLLM enables the FlashInfer allreduce+RMSNorm fusion
    only there: not on 12.0, e.g. RTX PRO 6000, nor Ampere/Ada), TP in {2, 4, 8, 16}, FlashInfer
    with its comm module installed.
    Ruled out by: TP = 1, CPU, other capabilities, eager / compilation NONE.
    Checked: vLLM 0.32 config/vllm.py (``enable_allreduce_rms_fusion``: TP > 1, CUDA,
    ``has_flashinfer()``, ``is_device_capability_family(100)`` or ``is_device_capability(90)``),
    config/compilation.py (``PassConfig.flashinfer_max_size``: world sizes 2/4/8/16),
    compilation/passes/fusion/allreduce_rms_fusion.py (its "disabled" warnings).
    """
    tp = facts.tensor_parallel_size or 1
    passes = facts.fusion_passes or {}
    logged = facts.evidence.get("allreduce_fusion_off", [])
    if tp <= 1 or facts.enforce_eager or facts.compilation_mode not in ("VLLM_COMPILE", None):
        return None
    if passes.get("fuse_allreduce_rms") is not False and not logged:
        return None
    cap, why = capability(ctx)
    f = Finding(
        id="allreduce-fusion-off",
        title=f"AllReduce + RMSNorm fusion is off at TP={tp}",
        figures={"tp": tp},
        severity="warning",
        evidence=logged + facts.evidence.get("compilation", [])[:1],
        predicted_effect="each layer's allreduce and the RMSNorm after it run as separate "
        "kernels with a round trip through memory",
        doc=doc_path("allreduce-fusion-off"),
    )
    pre = [
        on_gpu(facts),
        Precondition(fact="TP is 2, 4, 8 or 16", holds=tp in (2, 4, 8, 16), because=f"TP={tp}"),
        Precondition(
            fact="compute capability 9.0 or 10.x (where the fused kernel exists)",
            holds=None if cap is None else (cap == 9.0 or 10.0 <= cap < 11.0),
            because=why,
        ),
        Precondition(
            fact="FlashInfer's comm module is installed",
            holds=False
            if any("not installed" in ln for ln in logged)
            else (True if flashinfer_in_use(facts) else None),
            because="the engine said so"
            if logged
            else (
                "FlashInfer kernels in use" if flashinfer_in_use(facts) else "the log does not say"
            ),
        ),
    ]
    return decide(
        f,
        pre,
        engine_fix(ctx, "allreduce-fusion-off", "turn the allreduce + RMSNorm fusion pass on"),
        PROBE_HINT + " Check that flashinfer imports in the engine's environment.",
    )


# ---- B1 / B2: CUDA graphs ------------------------------------------------------------------


def eager_mode(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
    """B1. Trigger: ``enforce_eager`` (vLLM), ``disable_cuda_graph`` (SGLang), or cudagraph_mode
    NONE on a GPU; on the CPU, ``enforce_eager`` or compilation mode NONE (the CPU build's
    DYNAMO_TRACE_ONCE + Inductor is compiled, though its cudagraph_mode is always NONE).

    On a GPU: CUDA graphs off, and in vLLM torch.compile too. On the CPU build there are no
    CUDA graphs, but ``enforce_eager`` still turns torch.compile off: the finding says that and
    what it costs there (measured, docs/causes/eager-mode.md), without GPU advice.
    Needs (GPU advice): a GPU. Ruled out by: nothing else (a kernel that is not capture-safe is
    a reason to keep eager: the page says how to tell).
    Checked: vLLM 0.32 config/vllm.py (enforce_eager -> ``CompilationMode.NONE``,
    ``CUDAGraphMode.NONE``, "Enforce eager set, disabling torch.compile, CUDAGraphs ...");
    SGLang 004e656 server_args.py (``disable_cuda_graph``).
    """
    gpu = on_gpu(facts)
    if gpu.holds is False:
        # no CUDA graphs exist on the CPU build, so cudagraph_mode NONE says nothing there:
        # eager means torch.compile off (a compiled CPU log is not eager)
        eager = facts.enforce_eager or facts.compilation_mode in ("NONE", "0")
    else:
        eager = facts.enforce_eager or facts.cudagraph_mode in ("NONE", "0")
    if not eager:
        return None
    f = Finding(
        id="eager-mode",
        title="CUDA graphs are off (eager mode / cudagraph_mode NONE)"
        if gpu.holds is not False
        else "Eager mode: torch.compile is off (the CPU build has no CUDA graphs)",
        severity="warning" if gpu.holds is not False else "info",
        evidence=facts.evidence.get("eager", []) + facts.evidence.get("compilation", [])[:1],
        predicted_effect=(
            # llama.cpp launches its kernels from C++: the graph saves far less than PyTorch's
            "llama.cpp: decode step 4.27 -> 4.17 ms with CUDA graphs for a Llama-8B Q4_K_M on "
            "one H200 (our recorded run, 2026-12-02); more for small models"
            if gpu.holds is not False and facts.engine == "llamacpp"
            else "decode step 9.71 -> 4.75 ms with a CUDA graph for a Llama-8B shape on one H200 "
            "(our probe); less for large models"
            if gpu.holds is not False
            else "on the CPU build: per-operator dispatch instead of compiled kernels; for the "
            "tiny model the difference was within the noise of a shared 2-core box"
        ),
        doc=doc_path("eager-mode"),
    )
    if gpu.holds is False:
        f.preconditions = [gpu]
        return decide(
            f,
            [
                Precondition(
                    fact="compiling speeds this model up on the CPU build",
                    holds=None,
                    because="not measured for this model (the tiny model's runs were within the "
                    "noise of a shared 2-core box: see the page)",
                )
            ],
            engine_fix(ctx, "eager-mode.cpu", "drop the eager-mode flag to compile the model"),
            "Measure both with `ceiling compare` before choosing.",
        )
    return decide(
        f,
        [gpu],
        engine_fix(ctx, "eager-mode", "turn CUDA graphs on (drop the engine's eager-mode flag)"),
    )


def partial_cudagraphs(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
    """B2. Trigger: the engine lowered the CUDA-graph mode so that *decode* is no longer in a
    full graph ("... setting cudagraph_mode=PIECEWISE" or "=NONE"), or truncated the largest
    capture size below the intended batch.

    Needs: for a downgrade, an attention backend that supports full graphs for this model on
    this GPU (unknown from the log: the page lists where to look); for a truncated capture, a
    batch larger than the captured size (the intended concurrency).
    Ruled out by: downgrades to FULL_AND_PIECEWISE / FULL_DECODE_ONLY (decode still runs as
    one full graph); concurrency within the captured sizes.
    Checked: vLLM 0.32 config/compilation.py (``resolve_cudagraph_mode_and_sizes``: the four
    "is not supported with ... setting cudagraph_mode=X" messages), config/vllm.py
    ("Truncating max_cudagraph_capture_size to %d", capture sizes bounded by max_num_tokens).
    """
    lines = facts.evidence.get("partial_cudagraphs", [])
    if not lines:
        return None
    to = facts.cudagraph_downgrade
    truncated = any("Truncating" in ln for ln in lines)
    f = Finding(
        id="partial-cudagraphs",
        title="Decode is not fully captured in CUDA graphs"
        + (f" (cudagraph_mode lowered to {to})" if to else " (capture sizes truncated)"),
        severity="warning",
        evidence=lines,
        predicted_effect="attention runs eager between graph pieces, or batches above the "
        "largest captured size run eager: up to 4.3x at 30k context in one report",
        doc=doc_path("partial-cudagraphs"),
    )
    pre = [on_gpu(facts)]
    if to is not None:
        pre.append(
            Precondition(
                fact="decode lost its full graph (mode PIECEWISE or NONE)",
                holds=to in ("PIECEWISE", "NONE"),
                because=f"the engine set cudagraph_mode={to}",
            )
        )
        pre.append(
            Precondition(
                fact="another attention backend supports full graphs for this model and GPU",
                holds=None,
                because=f"backend {facts.attention_backend or 'unknown'}; the alternatives "
                "depend on the GPU and the model's attention type",
            )
        )
        return decide(
            f,
            pre,
            engine_fix(
                ctx, "partial-cudagraphs", "use an attention backend with full-graph support"
            ),
            "The page lists how to see which backends support full graphs.",
        )
    if truncated:
        size = facts.max_cudagraph_capture_size
        pre.append(
            Precondition(
                fact="the intended batch exceeds the largest captured size",
                holds=None if ctx.concurrency is None or size is None else ctx.concurrency > size,
                because=f"concurrency {ctx.concurrency}, largest capture {size}",
            )
        )
        return decide(
            f,
            pre,
            engine_fix(ctx, "partial-cudagraphs.size", "capture graphs up to the batch you serve"),
            "Pass the streams you intend to serve (inspect --streams).",
        )
    return None


# a warm-up that holds the server back this long is worth a relaunch's thought
WARMUP_SLOW_S = 120.0


def startup_warmup(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
    """Start-up JIT. Trigger: the log's warm-up progress (vLLM's DeepGEMM warm-up of every FP8
    block-scaled GEMM shape the server may run) adds up to WARMUP_SLOW_S or more.

    Needs: nothing (the time is read from the engine's own progress bar).
    Checked: vLLM 0.25 model_executor/warmup/deep_gemm_warmup.py, envs.py
    (``VLLM_DEEP_GEMM_WARMUP``: skip / relax (default) / full); seen on an H200: 1,155 shapes of
    Qwen3-32B-FP8 at ~1 s each, the server not ready after 5 minutes.
    """
    eta = facts.warmup_eta_s
    if eta is None or eta < WARMUP_SLOW_S:
        return None
    done = f", {facts.warmup_done} done when the log ends" if facts.warmup_done else ""
    return Finding(
        id="startup-warmup",
        title=f"{facts.warmup} compiles {facts.warmup_shapes} kernel shapes before the server "
        f"is ready: about {eta / 60:.0f} min by its own progress bar{done}",
        figures={"warmup_eta_s": eta, "warmup_shapes": float(facts.warmup_shapes or 0)},
        severity="info",
        evidence=facts.evidence.get("warmup", [])[:1],
        fix=engine_fix(ctx, "startup-warmup", "skip the start-up warm-up or keep its cache"),
        kind="configurable",
        predicted_effect=f"about {eta / 60:.0f} min per start; no change to the decode step",
        doc=doc_path("startup-warmup"),
    )


RULES_COMPUTE: list[Rule] = [
    custom_allreduce_off,
    compile_off,
    quant_fusion_off,
    allreduce_fusion_off,
    eager_mode,
    partial_cudagraphs,
    startup_warmup,
]
