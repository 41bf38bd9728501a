"""Alpha-beta latency of the collectives a decode step issues, per link kind and implementation.

Small decode messages (B x hidden x 2 bytes, 14 KB for hidden 7168 at B=1) are latency-bound:
what matters is the per-call base cost, the number of ring steps (2(n-1) for a ring allreduce),
and whether a one-shot custom kernel replaces NCCL. Constants live in ``data/links.yaml``; a
measured profile (``commbench``) replaces them for the matching implementation and world size.
"""

from __future__ import annotations

from ceiling.spec.hardware import Link
from ceiling.spec.profile import CollectiveFit, HardwareProfile


def _profile_fit(
    profile: HardwareProfile | None,
    impl: str,
    n: int,
    collective: str = "allreduce",
    in_cuda_graph: bool | None = None,
) -> CollectiveFit | None:
    """The measured fit that best describes this deployment's collective.

    A commbench profile holds one fit per (setting, world size, eager/graph). The deployment
    runs the default NCCL settings (no NCCL_* tuning variables), inside a CUDA graph when graphs
    are on: prefer fits that match on world size first, then on graph mode, then on default
    settings, so that a tuning variant measured earlier in the file never stands in for the
    default.
    """
    if profile is None:
        return None
    fits = [
        c
        for c in profile.collectives
        if c.collective == collective and c.implementation == impl and c.world_size > 1
    ]
    if not fits:
        return None

    def rank(c: CollectiveFit) -> tuple[int, int, int]:
        graph_mismatch = 0 if in_cuda_graph is None or c.in_cuda_graph == in_cuda_graph else 1
        tuned = 1 if any(k.startswith("NCCL_") and k not in _SAFETY_ENV for k in c.env) else 0
        return (abs(c.world_size - n), graph_mismatch, tuned)

    return min(fits, key=rank)


# Variables commbench sets in every process for safety (NVLink multicast off); they are not
# tuning, so a fit carrying only these still describes the default configuration.
_SAFETY_ENV = frozenset({"NCCL_NVLS_ENABLE"})


def allreduce_us(
    link: Link,
    impl: str,
    n: int,
    nbytes: float,
    profile: HardwareProfile | None = None,
    in_cuda_graph: bool | None = None,
) -> float:
    """Latency of one allreduce of ``nbytes`` over ``n`` ranks (microseconds)."""
    if n <= 1 or impl == "none":
        return 0.0
    fit = _profile_fit(profile, impl, n, in_cuda_graph=in_cuda_graph)
    if fit is not None:
        scale = 1.0
        if fit.world_size != n and impl == "nccl":
            # rescale the measured alpha by the ring-step ratio of the link model
            model = link.nccl.base_us + 2 * (n - 1) * link.nccl.hop_us
            at_fit = link.nccl.base_us + 2 * (fit.world_size - 1) * link.nccl.hop_us
            scale = model / at_fit
        return fit.alpha_us * scale + nbytes / (fit.beta_GBps * 1e3)
    if impl == "oneshot":
        if link.oneshot is None:
            raise ValueError(f"link {link.name} has no one-shot allreduce (no P2P)")
        o = link.oneshot
        return o.base_us + n * o.per_rank_us + (n - 1) * nbytes / (o.ingress_GBps * 1e3)
    c = link.nccl
    return c.base_us + 2 * (n - 1) * c.hop_us + (2 * (n - 1) / n) * nbytes / (c.busbw_GBps * 1e3)


def alltoall_us(link: Link, n: int, nbytes_per_rank: float) -> float:
    """One all-to-all (EP dispatch or combine) where each rank sends ``nbytes_per_rank``."""
    if n <= 1:
        return 0.0
    c = link.nccl
    return c.base_us + (n - 1) * c.hop_us + nbytes_per_rank * (n - 1) / n / (link.bw_GBps * 1e3)


def send_us(link: Link, nbytes: float) -> float:
    """One point-to-point send between pipeline stages."""
    return link.p2p_us + nbytes / (link.bw_GBps * 1e3)


def ring_us(link: Link, n: int, total_bytes: float) -> float:
    """One NCCL ring all-gather or reduce-scatter whose full buffer is ``total_bytes``: n - 1
    steps, each rank moving (n - 1) / n of the buffer (NCCL's algorithm bandwidth model:
    busbw = algbw x (n - 1) / n for both)."""
    if n <= 1:
        return 0.0
    c = link.nccl
    return c.base_us + (n - 1) * c.hop_us + (n - 1) / n * total_bytes / (c.busbw_GBps * 1e3)
