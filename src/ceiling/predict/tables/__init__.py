"""The one adapter to aiconfigurator's measured per-operation tables (optional extra).

``pip install 'ceiling[tables]'`` brings NVIDIA's ``aiconfigurator-core`` (Apache-2.0), whose
``systems/data/<system>/<op>/<engine>/<version>/*.parquet`` hold kernel latencies measured per
GPU system and engine version. ``predict`` never needs it (it has priors); when it is present,
this module turns the tables into small per-kernel fits and ``predict`` marks those ops
``source: table``.

What it reads (decode-relevant rows only), and the fit it keeps per kernel:

- ``gemm``: latency at M = 1..1025 tokens over a grid of (N, K) -> per M, ``t = t0 + bytes/bw``.
  The slope comes from weights above 1.5x the GPU's L2 (the tables time each shape in a loop,
  so small weights are L2-hot there but are streamed from DRAM in a real step); ``t0`` is the
  median excess over that line of 1-16 MB shapes (decode-sized matrices).
- ``moe``: fused-MoE latency at 1..512 tokens (balanced routing, EP = 1) -> per token count,
  ``t = t0 + active expert bytes/bw`` (active experts = min(E, tokens x top-k)).
- ``attention`` (GQA decode), ``mla`` (MLA decode kernel), ``gdn`` (gated-delta-rule decode):
  ``t = t0 + KV-or-state bytes/bw`` per kernel and KV dtype.
- ``comm``: allreduce latency vs message size per world size, NCCL and the engines' custom
  allreduce (kept as points; looked up by log-log interpolation).

Table quality is checked before a fit is trusted (``quality``): a slope faster than the
datasheet bandwidth, a relative fit error above 35 %, or a kernel whose small-shape latency is
3x another engine's kernel for the same format on the same GPU (JIT or warm-up in the
measurement, or a slow fallback the engine does not pick at decode) are flagged, and ``predict``
falls back to the next evidence.

Cold-start cost: building the fits reads the parquet files of one GPU system once (a few
seconds, pyarrow); they are cached as JSON in ceiling's cache (``$CEILING_CACHE_DIR``, else
``$XDG_CACHE_HOME/ceiling`` or ``~/.cache/ceiling``), keyed by the package version and ``FIT_VERSION``, one small file per
table key behind an index (``store``), so a later prediction reads only the keys it uses.
"""

from ceiling.predict.tables.core import (
    BYTES_PER_PARAM,
    PINNED,
    Fit,
    TablesInfo,
    info,
    system_bw_GBps,
)
from ceiling.predict.tables.lookup import (
    Measured,
    _at,
    _vkey,
    allreduce_points,
    attention_measured,
    gemm_measured,
    interp_points,
    kernel_fit,
    mla_measured,
    moe_measured,
    quality,
)
from ceiling.predict.tables.store import _raw, system_fits

__all__ = [
    "BYTES_PER_PARAM",
    "PINNED",
    "Fit",
    "Measured",
    "TablesInfo",
    "_at",
    "_raw",
    "_vkey",
    "allreduce_points",
    "attention_measured",
    "gemm_measured",
    "info",
    "interp_points",
    "kernel_fit",
    "mla_measured",
    "moe_measured",
    "quality",
    "system_bw_GBps",
    "system_fits",
]
