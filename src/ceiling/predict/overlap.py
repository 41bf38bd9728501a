"""Work an engine runs on a second CUDA stream beside the main one: the MoE shared expert.

vLLM runs a MoE layer's shared expert on an auxiliary CUDA stream, concurrently with the gate,
the router and the routed experts, when the step holds at most
``VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD`` tokens (default 256) on a CUDA GPU
(``fused_moe/runner/shared_experts.py``: ``SharedExpertsOrder.MULTI_STREAM_OVERLAPPED``; the
rule and its source are in ``data/predict/engines.yaml``, ``shared_expert_stream``).

The two streams share the GPU's memory bandwidth and its SMs, so the pair takes at least the
time to read both weight sets, at least the longer of the two streams, and in practice hides
only a share of the shorter one:

    pair = max(main, aux, (main bytes + aux bytes) / bandwidth,
               main + aux - share x min(main, aux))

``share`` (``stream_overlap_share`` in ``data/predict/constants.yaml``, 0.61) is measured on an
H200 with ``experiments/gpu/stream_overlap.py`` (28-78 % over four MoE shapes, their median), never
fitted to end-to-end rows. What hides is the fixed costs of small, latency-bound kernels at
decode batch sizes, not the bytes. The hidden time comes off the shared expert's
rows (the op table says so in their notes) and off the step's ``launch`` component; the bound
gets the same treatment (the best engine overlaps too).
"""

from __future__ import annotations

from typing import Literal

from ceiling.predict.choices import engine_entry
from ceiling.predict.opspec import OpRow, OpSpec
from ceiling.predict.resolved import Setup

MAIN = ("moe.router", "moe.topk", "moe.experts")
AUX_PREFIX = "moe.shared."


def shared_stream_rule(s: Setup, batch: int) -> str:
    """Why the engine overlaps the shared expert in this setup ('' when it does not)."""
    entry = engine_entry(s.dep.engine)
    rule = entry.shared_expert_stream if entry is not None else None
    if rule is None or not s.spec.is_moe or not s.spec.n_shared:
        return ""
    if batch > rule.max_tokens:
        return ""
    if s.gpu.arch in rule.skip_arch:
        return ""
    archs = rule.architectures
    if archs and not s.spec.architecture.startswith(tuple(archs)):
        return ""
    return rule.rule.strip()


def _bytes_ms(rows: list[OpRow], ops: list[OpSpec], bw_GBps: float) -> float:
    return (
        sum(r.count * op.weight_bytes for r, op in zip(rows, ops, strict=True))
        / (bw_GBps * 1e9)
        * 1e3
    )


def hide(
    rows: list[OpRow],
    ops: list[OpSpec],
    attr: Literal["expected_ms", "bound_ms"],
    bw_GBps: float,
    share: float = 1.0,
) -> float:
    """Apply the overlap to ``attr`` (``expected_ms`` or ``bound_ms``) of the shared-expert
    rows; return the ms per step it hides (0 when there is nothing to overlap)."""
    main = [(r, op) for r, op in zip(rows, ops, strict=True) if r.name in MAIN]
    aux = [(r, op) for r, op in zip(rows, ops, strict=True) if r.name.startswith(AUX_PREFIX)]
    if not main or not aux:
        return 0.0
    t_main = sum(getattr(r, attr) for r, _ in main)
    t_aux = sum(getattr(r, attr) for r, _ in aux)
    pair_rows = [r for r, _ in main + aux]
    pair_ops = [op for _, op in main + aux]
    floor = _bytes_ms(pair_rows, pair_ops, bw_GBps)
    pair = max(t_main, t_aux, floor, t_main + t_aux - share * min(t_main, t_aux))
    hidden = max(t_main + t_aux - pair, 0.0)
    if hidden <= 0 or t_aux <= 0:
        return 0.0
    keep = 1.0 - hidden / t_aux
    n = max(aux[0][0].count, 1.0)
    for r, _ in aux:
        before = getattr(r, attr)
        setattr(r, attr, before * keep)
        if attr == "expected_ms":
            r.hidden_ms = before * (1.0 - keep)
            note = (
                f"on a second stream beside the routed experts: {hidden / n * 1e3:.3g} of "
                f"{t_aux / n * 1e3:.3g} us per layer hidden (see assumptions)"
            )
            r.note = f"{r.note}; {note}" if r.note else note
    return hidden


def clamp_bound(rows: list[OpRow]) -> float:
    """Keep every shared-expert row's bound at or below its expected time without losing the
    bound's bytes: the expected figure hides more of the shared expert (its fixed costs) than
    the bound (bytes only), so the shared expert's bytes that exceed its expected row are
    carried by the main stream's rows, which have the room (they ran meanwhile). Returns the
    ms that found no room (taken off the bound; 0 in practice)."""
    excess = 0.0
    for r in rows:
        if r.name.startswith(AUX_PREFIX) and r.bound_ms > r.expected_ms:
            excess += r.bound_ms - r.expected_ms
            r.bound_ms = r.expected_ms
    main = [r for r in rows if r.name in MAIN and r.expected_ms > r.bound_ms]
    room = sum(r.expected_ms - r.bound_ms for r in main)
    moved = min(excess, room)
    for r in main:
        r.bound_ms += moved * (r.expected_ms - r.bound_ms) / room
    return excess - moved


def take_from(comps: dict[str, float], hidden: float) -> None:
    """Take ``hidden`` ms off the step's components: launch first (fixed costs are what
    overlaps), then weights if a faster-than-reference op left launch short."""
    for key in ("launch", "weights"):
        if hidden <= 0:
            return
        take = min(comps.get(key, 0.0), hidden)
        comps[key] = comps.get(key, 0.0) - take
        hidden -= take
