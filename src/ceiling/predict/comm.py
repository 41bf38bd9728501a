"""Collective ops of a decode step: the engine's choice (expected) and the best algorithm (bound).

Expected, per call:
- allreduce: the implementation the engine picks (``Deployment.resolve_allreduce``: vLLM/SGLang
  custom allreduce only for world sizes 2/4/6/8, with P2P, on NVLink or at most two PCIe-only
  GPUs, below its 8 MiB buffer; vllm/distributed/device_communicators/custom_all_reduce.py),
  and inside it vLLM's algorithm crossover (csrc/custom_all_reduce.cuh: one-shot for world
  size 2; on full NVLink one-shot below 512 KB at <= 4 ranks / 256 KB at <= 8, two-shot
  above; PCIe pairs stay one-shot). Latency from a measured profile (commbench), else
  aiconfigurator's allreduce table for the GPU when the box is the table's kind (NVLink), else
  the link's alpha-beta constants (``data/links.yaml``).
- logits gather (TP), all-to-all (EP with DP attention), pipeline sends: link constants.

Bound: the fastest algorithm the link allows at that size (one-shot where there is P2P, NCCL's
ring otherwise, or a faster measured fit), never the engine's choice.
"""

from __future__ import annotations

from ceiling.predict.collectives import allreduce_us, alltoall_us, ring_us, send_us
from ceiling.predict.ladder import climb, ladder
from ceiling.predict.opspec import CommShape, OpSpec, OpTime
from ceiling.predict.resolved import Setup

# aiconfigurator allreduce table rows per implementation (kernel_source substrings)
_TABLE_IMPL = {
    ("vllm", "oneshot"): ["vLLM_custom_graph"],
    ("sglang", "oneshot"): ["SGLang_CustomAllReduce_graph"],
    ("trtllm", "oneshot"): ["trtllm/"],
    ("vllm", "twoshot"): ["vLLM_custom_graph"],
    ("sglang", "twoshot"): ["SGLang_CustomAllReduce_graph"],
}


def _algorithm(s: Setup, nbytes: float) -> tuple[str, str]:
    """(implementation, why) for one allreduce of ``nbytes`` under the engine's rules."""
    impl = s.allreduce_impl
    n = s.dep.tp
    if impl != "oneshot":
        return impl, ""
    if nbytes >= s.rules.custom_ar_max_bytes:
        return "nccl", "message above the custom-allreduce buffer: NCCL"
    if n > 2 and s.link.custom_ar_class == "nvlink":
        limit = 512 * 1024 if n <= 4 else 256 * 1024
        if nbytes >= limit:
            return "twoshot", f"custom allreduce two-shot above {limit // 1024} KB"
    return "oneshot", ""


def _link_us(s: Setup, impl: str, n: int, nbytes: float) -> float:
    link = s.link
    if impl == "twoshot" and link.oneshot is not None:
        o = link.oneshot
        return o.base_us + 2 * n * o.per_rank_us + 2 * (n - 1) / n * nbytes / (o.ingress_GBps * 1e3)
    return allreduce_us(link, "nccl" if impl == "twoshot" else impl, n, nbytes)


def _table_us(s: Setup, impl: str, n: int, nbytes: float) -> tuple[float, str] | None:
    """Allreduce latency from aiconfigurator's table for this GPU (NVLink boxes only: the tables
    were measured on NVSwitch systems; a PCIe box's topology varies too much)."""
    if s.link.kind != "nvlink" or not s.gpu.aic_system or not s.gpu.nvlink:
        return None
    from ceiling.predict import tables

    if tables.info() is None:
        return None
    needles = ["nccl/"] if impl == "nccl" else _TABLE_IMPL.get((s.dep.engine, impl))
    if not needles:
        return None
    pts = tables.allreduce_points(s.gpu.aic_system, needles, n)
    if not pts:
        return None
    return tables.interp_points(pts, nbytes), f"table {s.gpu.aic_system} {needles[0]}"


def best_allreduce_us(s: Setup, n: int, nbytes: float) -> float:
    """The bound: the fastest allreduce the link allows at this size."""
    link = s.link
    options = [allreduce_us(link, "nccl", n, nbytes)]
    if link.oneshot is not None:
        options.append(allreduce_us(link, "oneshot", n, nbytes))
        options.append(_link_us(s, "twoshot", n, nbytes))
    p = s.profile
    if p is not None:
        for fit in p.collectives:
            if fit.collective == "allreduce" and fit.world_size == n:
                options.append(fit.alpha_us + nbytes / (fit.beta_GBps * 1e3))
    return min(options)


def comm_time(s: Setup, op: OpSpec) -> OpTime:
    """Expected and bound latency (us per call) of one collective op, up the evidence ladder
    (``predict.ladder``): an allreduce from a commbench fit, aiconfigurator's table or the
    link's constants; the other collectives from the link's constants (their only rung)."""
    sh = op.shape
    assert isinstance(sh, CommShape)  # every comm op carries one (ops._comm_ops)
    n = int(sh.ranks)
    nbytes = float(sh.bytes)
    coll = sh.collective
    if coll == "allreduce":
        return _allreduce_time(s, n, nbytes)
    link = s.link
    if coll in ("allgather", "reducescatter"):
        # vLLM's GroupCoordinator runs both through NCCL (PyNccl), never its custom allreduce
        total = nbytes * n if coll == "allgather" else nbytes
        us, kernel = ring_us(link, n, total), f"{coll}/nccl"
    elif coll in ("gather", "alltoall"):
        us, kernel = alltoall_us(link, n, nbytes), f"{coll}/nccl"
    else:
        us, kernel = send_us(link, nbytes), "send"
    conf = ladder().confidence.prior.link_other
    bound = us * s.consts.bound_comm_other_fraction
    note = f"{link.name} constants"
    return climb({"prior": lambda: OpTime(us, bound, "prior", conf, kernel, note)})


def _allreduce_time(s: Setup, n: int, nbytes: float) -> OpTime:
    link = s.link
    c = ladder().confidence
    impl, why = _algorithm(s, nbytes)
    bound = best_allreduce_us(s, n, nbytes) * s.consts.bound_comm_fraction
    base_impl = "nccl" if impl == "twoshot" and link.oneshot is None else impl
    fit_impl = "oneshot" if impl == "twoshot" else base_impl

    def timed(us: float, src: str, conf: float, note: str) -> OpTime:
        note = f"{note}; {why}" if why else note
        return OpTime(max(us, bound), bound, src, conf, f"allreduce/{impl}", note)

    def from_profile() -> OpTime | None:
        p = s.profile
        if p is None or not any(
            f.collective == "allreduce" and f.implementation == fit_impl for f in p.collectives
        ):
            return None
        us = allreduce_us(link, fit_impl, n, nbytes, p, in_cuda_graph=s.dep.cuda_graphs)
        return timed(us, "profile", c.profile.collective, f"{impl} (commbench fit)")

    def from_table() -> OpTime | None:
        tab = _table_us(s, impl, n, nbytes)
        return None if tab is None else timed(tab[0], "table", c.table.collective, tab[1])

    def from_prior() -> OpTime:
        us = _link_us(s, base_impl, n, nbytes)
        return timed(us, "prior", c.prior.link_allreduce, f"{impl} ({link.name} constants)")

    return climb({"profile": from_profile, "table": from_table, "prior": from_prior})
