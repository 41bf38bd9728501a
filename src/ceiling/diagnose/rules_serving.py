"""Finding rules about memory and scheduling (C), kernels and formats (E), parallel layout (F),
speculative decoding (G) and configuration hygiene (H). Same contract as ``rules.py``: each
rule says what its advice needs, what rules it out, and what was read in the engines' source.
"""

from __future__ import annotations

from ceiling.diagnose.facts import EngineFacts
from ceiling.diagnose.finding_types import Finding, FindingContext, Precondition, decide, doc_path
from ceiling.diagnose.rules import (
    LOAD_SHARE,
    PROBE_HINT,
    SLOW_START_S,
    SPEC_MIN_ACCEPTANCE,
    Rule,
    engine_fix,
    engine_fixes,
)

# vLLM 0.32 engine/arg_utils.py (``get_batch_defaults``): max_num_seqs when not set
VLLM_DEFAULT_MAX_NUM_SEQS = {"cpu": 128, "gpu": 256}
# vLLM's default --gpu-memory-utilization (config/cache.py, 0.32) and the highest worth asking
VLLM_DEFAULT_GPU_MEM_UTIL = 0.9
MAX_USEFUL_GPU_MEM_UTIL = 0.95


def kv_capacity(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
    """C1. Trigger: the KV cache holds fewer full-length requests than the intended
    concurrency (below 1 when none is given).

    Each remedy is offered only where it can help: more KV memory while the memory fraction is
    below 0.95; an FP8 KV cache when the cache is not FP8 already; a shorter maximum length when
    it exceeds what one request needs (request tokens known); fewer sequences always.
    Ruled out by: capacity at or above the intended concurrency.
    Checked: vLLM 0.32 v1/core/kv_cache_utils.py ("GPU/CPU KV cache size: %s tokens",
    "Maximum concurrency for %s tokens per request: %.2fx"), v1/worker/cpu_worker.py
    (``--kv-cache-memory-bytes`` / ``VLLM_CPU_KVCACHE_SPACE`` on the CPU build), engine/
    arg_utils.py; SGLang 004e656 scheduler ("max_total_num_tokens=", ``mem_fraction_static``).
    """
    want = ctx.concurrency if ctx.concurrency is not None else 1
    per_request, asked = facts.max_model_len, ctx.request_tokens
    if per_request is not None and asked is not None and per_request < asked:
        # each request is cut short whatever the concurrency (llama-server: ctx-size / parallel)
        f = Finding(
            id="kv-capacity",
            title=f"Each request gets {per_request} tokens of context; {asked} asked "
            "(prompt + output)",
            figures={"context_per_request": per_request, "request_tokens": asked},
            severity="critical",
            evidence=facts.evidence.get("kv", []) + facts.evidence.get("n_slots", []),
            predicted_effect="requests stop (or are refused) at the context limit: outputs "
            "come back shorter than asked",
            doc=doc_path("kv-capacity"),
        )
        f.fix, f.preconditions = kv_remedies(facts, ctx)
        return f
    if facts.max_concurrency is None:
        return None
    if facts.max_concurrency >= want:
        return None
    cap = facts.running_cap()
    limited_by_cap = cap is not None and cap == facts.max_concurrency
    if (
        (limited_by_cap or facts.kv_unified)
        and facts.kv_cache_tokens
        and asked
        and facts.kv_cache_tokens / asked >= want
    ):
        # the cache has room for the requests asked: the running-sequence cap limits
        # (concurrency-cap), or one unified pool (llama-server) holds several requests shorter
        # than the full length each may grow to
        return None
    f = Finding(
        id="kv-capacity",
        title=f"KV cache holds {facts.max_concurrency:.2f} full-length requests; {want} requested",
        figures={"requests_held": facts.max_concurrency, "concurrency": want},
        severity="critical",
        evidence=facts.evidence.get("kv", []),
        predicted_effect="requests beyond capacity are preempted and recomputed: throughput "
        "collapses (~14x in one report)",
        doc=doc_path("kv-capacity"),
    )
    f.fix, f.preconditions = kv_remedies(facts, ctx)
    return f


def kv_remedies(facts: EngineFacts, ctx: FindingContext) -> tuple[str, list[Precondition]]:
    """The KV remedies that can help here, in the engine's flags, and what each rests on."""
    fixes = engine_fixes(ctx)
    if "kv-capacity" in fixes:  # the engine says it in one sentence (llama.cpp: --n_ctx)
        return fixes["kv-capacity"], []
    pres: list[Precondition] = []
    util = facts.non_default_args.get("gpu_memory_utilization")
    util = float(util) if isinstance(util, int | float) else None
    kvd = (facts.kv_cache_dtype or "auto").lower()
    cpu = facts.device == "cpu"
    options = [
        (
            "memory-cpu" if cpu else "memory",
            "give the KV cache more memory",
            Precondition(
                fact="the memory fraction can still grow",
                holds=True
                if cpu
                else (util if util is not None else VLLM_DEFAULT_GPU_MEM_UTIL)
                < MAX_USEFUL_GPU_MEM_UTIL,
                because="CPU build: KV memory is set in bytes"
                if cpu
                else f"gpu_memory_utilization {util if util is not None else 'default 0.9'}",
            ),
        ),
        (
            "fp8",
            "an FP8 KV cache",
            Precondition(
                fact="the KV cache is not FP8 already, on a GPU",
                holds=not cpu and "fp8" not in kvd,
                because=f"kv_cache_dtype {kvd}, device {facts.device}",
            ),
        ),
        (
            "max-len",
            "a shorter maximum length",
            Precondition(
                fact="the maximum length exceeds what a request needs",
                holds=None
                if ctx.request_tokens is None or facts.max_model_len is None
                else facts.max_model_len > ctx.request_tokens,
                because=f"max_model_len {facts.max_model_len}, request tokens {ctx.request_tokens}",
            ),
        ),
        ("fewer-seqs", "serve fewer sequences", None),
    ]
    words = []
    for key, neutral, pre in options:
        text = fixes.get(f"kv-capacity.{key}", neutral)
        if pre is not None:
            if pre.holds is False:
                continue  # this remedy cannot help here: not offered
            pres.append(pre)
            if pre.holds is None:  # offered as a condition, never as a plain instruction
                text += f" (if {pre.fact}: {pre.because})"
        words.append(text)
    return "more KV: " + "; or ".join(words), pres


def concurrency_cap(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
    """C2. Trigger: ``max_num_seqs`` (vLLM) / ``max_running_requests`` (SGLang) below the
    intended concurrency: the rest wait in the queue whatever the KV cache could hold.

    Needs: the intended concurrency; KV room for more sequences (else ``kv-capacity`` speaks).
    Ruled out by: a cap at or above the concurrency; unknown caps (not set: the defaults are
    at least 128 in vLLM 0.32, so only a concurrency above that is in doubt).
    Checked: vLLM 0.32 engine/arg_utils.py (``get_batch_defaults``: 128 x world size on CPU,
    256 or 1024 on GPUs), v1/core/sched/scheduler.py (``max_num_running_reqs``); SGLang
    004e656 server_args.py (``max_running_requests``).
    """
    want = ctx.concurrency
    cap = facts.running_cap()
    if want is None or cap is None or cap >= want:
        return None
    f = Finding(
        id="concurrency-cap",
        title=f"The engine runs at most {cap} sequences at once; {want} requested",
        figures={"cap": cap, "concurrency": want},
        severity="critical" if cap * 2 <= want else "warning",
        evidence=facts.evidence.get("non_default", [])[:1] + facts.evidence.get("n_slots", [])[:1],
        predicted_effect=f"requests beyond {cap} queue: total throughput stays at what {cap} "
        "streams give, and latency grows with the queue",
        doc=doc_path("concurrency-cap"),
    )
    room, why = facts.max_concurrency, "no KV line in the log"
    holds: bool | None = None
    if facts.kv_cache_tokens and ctx.request_tokens:
        room = facts.kv_cache_tokens / ctx.request_tokens
        holds, why = (
            room >= want,
            f"{facts.kv_cache_tokens} KV tokens / {ctx.request_tokens} per request",
        )
    elif room is not None:
        # capacity in full-length requests: enough is enough; too little may still fit the
        # shorter requests actually served
        holds = True if room >= want else None
        why = f"KV capacity {room}x full-length requests; the request length is not known"
    pre = [
        Precondition(
            fact="the KV cache holds the intended concurrency at the request length",
            holds=holds,
            because=why,
        )
    ]
    return decide(
        f,
        pre,
        engine_fix(ctx, "concurrency-cap", f"raise the running-sequence cap to at least {want}"),
    )


def weight_only_fallback(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
    """E3. Trigger: "Your GPU does not have native support for FP4/FP8 computation ...
    Weight-only ... Marlin" (vLLM): the checkpoint's format runs weight-only on this GPU.

    Needs: nothing for the statement (the log proves it); the advice (a checkpoint in a format
    this GPU computes natively: FP8 on Hopper for an NVFP4 model, 16-bit or INT4 on Ampere for
    FP8) is conditional on such a checkpoint existing, which ceiling cannot know: it says so.
    Checked: vLLM 0.32 kernels/linear/nvfp4/marlin.py (``MarlinNvFp4LinearKernel.
    process_weights_after_loading``), utils/marlin_utils_fp4.py, utils/marlin_utils_fp8.py
    (``prepare_fp8_layer_for_marlin``).
    """
    fmt = facts.weight_only_fallback
    if not fmt:
        return None
    f = Finding(
        id="weight-only-fallback",
        title=f"{fmt} weights run weight-only (Marlin, 16-bit activations): this GPU has no "
        f"native {fmt} compute",
        severity="warning",
        kind="fundamental",
        evidence=facts.evidence.get("weight_only_fallback", []),
        predicted_effect=f"the memory saving of {fmt} stays; its compute speed does not (GEMMs "
        "at 16-bit rate plus dequantization), which costs most in prefill and at high batch",
        doc=doc_path("weight-only-fallback"),
    )
    pre = [
        Precondition(
            fact="a checkpoint of this model in a format the GPU computes natively exists",
            holds=None,
            because="ceiling does not know the model's published variants",
        )
    ]
    return decide(
        f,
        pre,
        None,
        "If a native-format checkpoint exists (FP8 on Hopper, for example), serve that one.",
    )


def quant_emulation(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
    """E3. Trigger: "NVFP4 linear falling back to the slow and unoptimized emulation backend".

    Needs: none for the statement; the engine lists why each optimized kernel was unavailable
    (quoted as evidence): the fix is the one the reasons name.
    Checked: vLLM 0.32 kernels/linear/__init__.py (``init_nvfp4_linear_kernel``).
    """
    lines = facts.evidence.get("quant_emulation", [])
    if not lines:
        return None
    return Finding(
        id="quant-emulation",
        title="NVFP4 GEMMs run in the slow emulation backend",
        severity="critical",
        evidence=lines,
        fix=engine_fix(
            ctx,
            "quant-emulation",
            "make an optimized NVFP4 kernel available (the evidence lists why each was not)",
        ),
        predicted_effect="emulated FP4 GEMMs are many times slower than native ones",
        doc=doc_path("quant-emulation"),
    )


def _from_line(key: str, finding: Finding, fix_key: str, neutral: str) -> Rule:
    """A finding that one kind of log line proves on its own, advice included."""

    def rule(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
        lines = facts.evidence.get(key, [])
        if not lines:
            return None
        f = finding.model_copy(deep=True)
        f.evidence = lines
        f.fix = engine_fix(ctx, fix_key, neutral)
        return f

    rule.__name__ = finding.id.replace("-", "_")
    return rule


# E3. Checked: the vLLM 0.10 FP8-KV "not supported" lines of the fixture (and their 0.32
# successors in v1/attention/backends/*: "FP8 kv is not supported with ..."); the advice
# (another backend, or accept 16-bit) holds by construction of the line.
fp8_kv_unavailable = _from_line(
    "fp8_kv_unavailable",
    Finding(
        id="fp8-kv-unavailable",
        title="FP8 KV cache unavailable with this backend/model",
        predicted_effect="KV capacity and KV read bandwidth stay at 16-bit (2x FP8)",
        doc=doc_path("fp8-kv-unavailable"),
    ),
    "fp8-kv-unavailable",
    "pick an attention backend that supports FP8 KV, or accept the 16-bit KV size",
)

# E1. Checked: vLLM 0.32 model_executor/layers/fused_moe/fused_moe.py (``get_default_config``
# path of ``try_get_optimal_moe_config``: the line is printed only when the Triton fused-MoE
# kernel runs without a tuned config file, so the tuning advice applies by construction).
default_moe_config = _from_line(
    "default_moe_config",
    Finding(
        id="default-moe-config",
        title="MoE kernels run with the default (untuned) config",
        severity="info",
        predicted_effect="a few to tens of percent on MoE layers",
        doc=doc_path("default-moe-config"),
    ),
    "default-moe-config",
    "tune the fused-MoE config for this GPU/shape or pick another MoE backend",
)

# H2. Checked: vLLM 0.32 envs.py (``validate_environ``: "Unknown vLLM environment variable
# detected: %s"): the engine ignored the variable, so renaming it is the only fix.
unknown_env = _from_line(
    "unknown_env",
    Finding(
        id="unknown-env",
        title="The engine ignored environment variables it does not know",
        predicted_effect="the run did not test what it meant to test",
        doc=doc_path("unknown-env"),
    ),
    "unknown-env",
    "fix the names (run `ceiling preflight`): these settings were never applied",
)


def expert_parallel_pcie(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
    """F1. Trigger: expert parallelism on (vLLM ``enable_expert_parallel``, SGLang ep_size > 1).

    Needs: a PCIe-only interconnect (all-to-all over PCIe is what costs; on NVLink EP is the
    usual choice). Known from ``ctx.interconnect`` (doctor's probe, --gpu) or from vLLM's own
    "not supported on more than two PCIe-only GPUs" line.
    Ruled out by: NVLink.
    Checked: vLLM 0.32 config/parallel.py (``enable_expert_parallel``), distributed/
    device_communicators/all2all.py; SGLang 004e656 server_args.py (``ep_size``).
    """
    if not facts.expert_parallel:
        return None
    pcie_log = "PCIe-only" in (facts.custom_allreduce_reason or "")
    inter = "pcie" if pcie_log else ctx.interconnect
    f = Finding(
        id="expert-parallel-pcie",
        title="Expert parallelism on: the MoE all-to-all crosses the GPU interconnect",
        severity="warning",
        evidence=facts.evidence.get("non_default", [])[:1]
        + facts.evidence.get("custom_allreduce", [])[:1],
        predicted_effect="on PCIe-only GPUs EP measured slower than TP-sharded experts in "
        "several reports (all-to-all saturates PCIe)",
        doc=doc_path("expert-parallel-pcie"),
    )
    pre = [
        Precondition(
            fact="the GPUs talk over PCIe only (no NVLink)",
            holds=None if inter is None else inter == "pcie",
            because="the engine's custom-allreduce line"
            if pcie_log
            else f"interconnect {inter or 'unknown'}",
        )
    ]
    return decide(
        f,
        pre,
        engine_fix(ctx, "expert-parallel-pcie", "shard the experts with TP instead of EP"),
        PROBE_HINT,
    )


def spec_decode_acceptance(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
    """G1. Trigger: the engine's speculative-decoding metrics show a mean acceptance length
    below 1.5 tokens per step (bonus token included: under half a draft token accepted).

    Needs: the metrics line (it is logged while serving); the advice (fewer draft tokens, or
    speculation off at high concurrency) needs nothing else.
    Checked: vLLM 0.32 v1/spec_decode/metrics.py (``SpecDecodingLogging.log``: "Mean acceptance
    length: %.2f ... Avg Draft acceptance rate: %.1f%%").
    """
    mean = facts.spec_mean_acceptance
    if mean is None or mean >= SPEC_MIN_ACCEPTANCE:
        return None
    return Finding(
        id="spec-decode-acceptance",
        title=f"Speculative decoding accepts little: mean acceptance length {mean:.2f}",
        figures={"mean_acceptance": mean},
        severity="warning",
        evidence=facts.evidence.get("spec_decode", [])[-2:],
        fix=engine_fix(
            ctx,
            "spec-decode-acceptance",
            "fewer speculative tokens, or speculation off (it costs most at high concurrency)",
        ),
        predicted_effect="each step verifies drafts that are thrown away: below ~1.5 accepted "
        "tokens per step the drafting costs more than it saves",
        doc=doc_path("spec-decode-acceptance"),
    )


def slow_restart(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
    """Restart cost. Trigger: start-up at or above 5 minutes (heuristic).

    Needs: nothing (the advice is about how to experiment, not a setting).
    Checked: the start-up time is the span of the log's timestamps up to readiness.
    """
    start = facts.startup_s
    load = facts.weights_load_s or facts.model_load_s
    if not start or start < SLOW_START_S:
        return None
    share = f"; loading weights {load:.0f} s of it" if load else ""
    return Finding(
        id="slow-restart",
        title=f"Each restart costs {start / 60:.1f} min{share}",
        figures={"startup_s": start} | ({"weights_load_s": load} if load else {}),
        severity="info",
        evidence=facts.evidence.get("load", []) + facts.evidence.get("init", []),
        fix="preflight every variant first and batch changes per relaunch; keep the server up "
        "and vary only request-side settings where possible",
        kind="configurable" if not load or load / start < LOAD_SHARE else "fundamental",
        predicted_effect=f"{start / 60:.1f} min of GPU time lost per relaunch",
        doc=doc_path("slow-restart"),
    )


def partial_offload(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
    """Layers on the CPU. Trigger: llama.cpp offloaded fewer layers to the GPU than the model
    has (``load_tensors: offloaded N/M layers to GPU``; ``-ngl`` below M).

    Needs: nothing (each decode step runs the CPU's layers at host memory bandwidth and moves
    the activations over PCIe twice). Ruled out by: every layer on the GPU.
    Checked: llama.cpp (llama-cpp-python 0.3.36) src/llama-model.cpp ``load_tensors``.
    """
    on, total = facts.gpu_layers, facts.gpu_layers_total
    if on is None or total is None or on >= total:
        return None
    return Finding(
        id="partial-offload",
        title=f"{total - on} of {total} layers run on the CPU (-ngl {on})",
        figures={"gpu_layers": on, "layers": total},
        severity="critical",
        evidence=facts.evidence.get("offloaded", []),
        fix=engine_fix(
            ctx, "partial-offload", "put every layer on the GPU, or a smaller quant that fits"
        ),
        predicted_effect="the CPU's share of the weights is read at host memory bandwidth "
        "(tens of GB/s against the GPU's TB/s): the step is host-bound",
        doc=doc_path("partial-offload"),
    )


def flash_attn_off(facts: EngineFacts, ctx: FindingContext) -> Finding | None:
    """Flash attention off on a GPU. Trigger: llama.cpp's ``llama_context: flash_attn =
    disabled`` on a GPU device.

    Needs: a GPU (the CPU backend's flash attention is not the point). Ruled out by: enabled.
    Checked: llama.cpp (llama-cpp-python 0.3.36) src/llama-context.cpp (``flash_attn``),
    src/llama-graph.cpp (without it: KQ mat-mul, soft-max and KQV mat-mul as separate ops).
    """
    if facts.flash_attention is not False or (facts.device or "cpu") == "cpu":
        return None
    return Finding(
        id="flash-attn-off",
        title="Flash attention is off: attention runs as separate mat-mul and soft-max kernels",
        severity="warning",
        evidence=facts.evidence.get("flash_attn", []),
        fix=engine_fix(ctx, "flash-attn-off", "turn flash attention on"),
        predicted_effect="more kernels and KV-cache reads per layer each step; grows with "
        "the context",
        doc=doc_path("flash-attn-off"),
    )


RULES_SERVING: list[Rule] = [
    kv_capacity,
    concurrency_cap,
    weight_only_fallback,
    quant_emulation,
    fp8_kv_unavailable,
    default_moe_config,
    expert_parallel_pcie,
    spec_decode_acceptance,
    unknown_env,
    slow_restart,
    partial_offload,
    flash_attn_off,
]
