"""Lookups of the aiconfigurator adapter: measured latency at an op's shape, kernel fits."""

from __future__ import annotations

import fnmatch
import itertools
import math
from collections.abc import Mapping
from functools import cache

from pydantic import BaseModel, Field

from ceiling.predict.tables.core import BYTES_PER_PARAM, Fit
from ceiling.predict.tables.interp import SPIKE_RATIO, _extend, _log_interp
from ceiling.predict.tables.moe_shapes import moe_other_shapes
from ceiling.predict.tables.store import _raw, system_fits


def _vkey(v: str) -> tuple[int, ...]:
    out = []
    for part in v.replace("rc", ".").replace("post", ".").replace("dev", ".").split("."):
        out.append(int(part) if part.isdigit() else 0)
    return tuple(out)


def _at(per_batch: dict[str, Fit], batch: float) -> Fit:
    """The fit at ``batch`` (log-interpolated between the nearest measured batch sizes)."""
    sizes = sorted(per_batch, key=lambda s: float(s) if s != "any" else 0.0)
    if "any" in per_batch:
        return per_batch["any"]
    vals = [float(s) for s in sizes]
    if batch <= vals[0]:
        return per_batch[sizes[0]]
    if batch >= vals[-1]:
        return per_batch[sizes[-1]]
    for i in range(1, len(vals)):
        if vals[i] >= batch:
            lo, hi = per_batch[sizes[i - 1]], per_batch[sizes[i]]
            w = math.log(batch / vals[i - 1]) / math.log(vals[i] / vals[i - 1])
            return Fit(
                key=lo.key,
                t0_us=lo.t0_us + w * (hi.t0_us - lo.t0_us),
                bw_GBps=1.0 / ((1 - w) / lo.bw_GBps + w / hi.bw_GBps)
                if lo.bw_GBps > 0 and hi.bw_GBps > 0
                else max(lo.bw_GBps, hi.bw_GBps),
                rel_err=max(lo.rel_err, hi.rel_err),
                points=lo.points + hi.points,
            )
    return per_batch[sizes[-1]]


def quality(fit: Fit, peers: list[Fit], datasheet_GBps: float) -> Fit:
    """Mark a fit untrusted when the table looks wrong (see the module docstring)."""
    notes = []
    if fit.bw_GBps > 1.02 * datasheet_GBps:
        notes.append(f"slope {fit.bw_GBps:.0f} GB/s beats the datasheet {datasheet_GBps:.0f}")
    if fit.rel_err > 0.35:
        notes.append(f"fit error {fit.rel_err:.0%}")
    best = min((p.t0_us for p in peers if p.key != fit.key), default=None)
    if best is not None and fit.t0_us > 3 * best and fit.t0_us - best > 10:
        notes.append(
            f"fixed cost {fit.t0_us:.0f} us vs {best:.0f} us for the same format in another "
            "engine's table on this GPU (measurement artifact or a kernel not used at decode)"
        )
    if notes:
        return fit.model_copy(update={"trusted": False, "note": "; ".join(notes)})
    return fit


class Measured(BaseModel):
    """A table latency for one op at its exact (or nearest) shape."""

    key: str
    us: float
    exact: bool = Field(description="the table holds this shape; False: scaled from a neighbour")
    note: str = ""


def _candidates(
    table: Mapping[str, object],
    engine: str,
    patterns: list[tuple[str, str]],
    skip: tuple[str, ...] = (),
) -> list[tuple[int, int, tuple[int, ...], str]]:
    """Table keys matching ``patterns`` ((kernel substring, dtype) in preference order), ordered:
    the engine's own table first (newest version), then other engines' tables; none of
    ``skip`` (tables the evidence check refused: the next candidate is tried)."""
    out = []
    for key in table:
        if key in skip:
            continue
        parts = key.split("/")
        eng, ver, rest = parts[0], parts[1], "/".join(parts[2:])
        for rank, (needle, dtype) in enumerate(patterns):
            if needle.lower() in rest.lower() and (not dtype or rest.endswith("/" + dtype)):
                out.append((0 if eng == engine else 1, rank, tuple(-x for x in _vkey(ver)), key))
                break
    out.sort()
    return out


def _index(rows: list[list[float]]) -> tuple[dict[tuple[int, int], float], list[int], list[int]]:
    grid = {(int(a), int(b)): t for a, b, t in rows}
    return grid, sorted({a for a, _ in grid}), sorted({b for _, b in grid})


_GRIDS: dict[int, tuple[dict[tuple[int, int], float], list[int], list[int]]] = {}


def _gemm_at(rows: list[list[float]], n: int, k: int) -> tuple[float, bool]:
    """Latency of an (n, k) GEMM by bilinear interpolation in (n, k) over the grid."""
    idx = _GRIDS.get(id(rows))
    if idx is None:  # index each table's rows once (the raw tables live for the process)
        idx = _GRIDS[id(rows)] = _index(rows)
    grid, ns, ks = idx

    def bracket(vals: list[int], v: int) -> tuple[int, int]:
        lo = max([x for x in vals if x <= v], default=vals[0])
        hi = min([x for x in vals if x >= v], default=vals[-1])
        return lo, hi

    (n0, n1), (k0, k1) = bracket(ns, n), bracket(ks, k)
    exact = n0 == n1 == n and k0 == k1 == k

    def at(a: int, b: int) -> float | None:
        return grid.get((a, b))

    corners = [at(n0, k0), at(n0, k1), at(n1, k0), at(n1, k1)]
    if any(c is None for c in corners):
        near = min(grid, key=lambda ab: abs(math.log(ab[0] / n)) + abs(math.log(ab[1] / k)))
        scale = (n * k) / (near[0] * near[1])
        return grid[near] * max(scale, 1.0) ** 0.5, False  # crude, marked not exact

    def w(v: int, lo: int, hi: int) -> float:
        # linear weights: a GEMV's latency is linear in N and in K (fixed cost + bytes), so
        # bilinear interpolation in (N, K) is exact between grid points; weights in log N
        # overstate it (N = 28672 between 16384 and 65536: +26 %)
        if hi == lo:
            return 0.0
        return (max(v, lo) - lo) / (hi - lo)

    wn, wk = w(min(n, n1), n0, n1), w(min(k, k1), k0, k1)
    c00, c01, c10, c11 = (float(c) for c in corners)  # type: ignore[arg-type]
    t = (1 - wn) * ((1 - wk) * c00 + wk * c01) + wn * ((1 - wk) * c10 + wk * c11)
    # outside the grid: extrapolate in proportion to the weight bytes
    t *= max(n / n1, 1.0) * max(k / k1, 1.0)
    return t, exact


def gemm_measured(
    system: str,
    engine: str,
    patterns: list[tuple[str, str]],
    m: float,
    n: int,
    k: int,
    skip: tuple[str, ...] = (),
) -> Measured | None:
    """Latency (us) of one GEMM from the tables, interpolated in M (tokens) and (N, K)."""
    return _gemm_cached(system, engine, tuple(patterns), m, n, k, tuple(skip))


@cache
def _gemm_cached(
    system: str,
    engine: str,
    patterns: tuple[tuple[str, str], ...],
    m: float,
    n: int,
    k: int,
    skip: tuple[str, ...] = (),
) -> Measured | None:
    raw = _raw(system, "gemm")
    for *_rank, key in _candidates(raw, engine, list(patterns), skip):
        per_m = raw[key]
        ms = _warm_rows(system, key, sorted(int(x) for x in per_m))
        if not ms:
            continue
        pts = []
        exact = True
        for mm in ms:
            t, ex = _gemm_at(per_m[str(mm)], n, k)
            pts.append((float(mm), t))
            exact = exact and ex
        # past the last row the same table goes on (``_extend``): another key or the prior
        # there made the step fall as the batch grew
        us, past = _extend(max(m, 1.0), pts), _past(m, ms[-1])
        return Measured(key=key, us=us, exact=exact and not past, note=past)
    return None


def _warm_rows(system: str, key: str, ms: list[int]) -> list[int]:
    """The table's token counts without a first row set timed before the kernel was warm.

    The same kernel at the next token count does at least the first row's work, so a first
    row set whose line fit (over all its shapes) carries over ``SPIKE_RATIO`` x the next one's
    fixed cost is warm-up, not the kernel: it is read from the next row (``_extend`` holds the
    first kept row below it). vLLM's CUTLASS FP8 per-tensor tables on the B200, B300 and GB200
    run one kernel config for 1-16 tokens (``scaled_mm_sm100_fp8_dispatch.cuh``), yet their
    1-token rows fit 20-22 us of fixed cost against 6 us at 2 tokens (slower on 92-100 % of
    the shapes). Read as measured, the rising envelope carried that offset up to 16 tokens
    and priced Llama-3.1-70B FP8 per-tensor on the B200 ~38 % slower than block-128."""
    if len(ms) < 2:
        return ms
    data = system_fits(system)
    fits = data.gemm.get(key, {}) if data is not None else {}
    first, second = fits.get(str(ms[0])), fits.get(str(ms[1]))
    if first and second and first.t0_us > SPIKE_RATIO * max(second.t0_us, 0.0) > 0:
        return ms[1:]
    return ms


def _past(x: float, end: float, what: str = "tokens") -> str:
    """The note of a row read past the table's last one (empty within the table)."""
    if x <= end * 1.01:
        return ""
    return f"past the table's last row ({end:g} {what}): along its last segment"


def moe_measured(
    system: str,
    engine: str,
    patterns: list[tuple[str, str]],
    tokens: float,
    hidden: int,
    inter: int,
    experts: int,
    topk: int,
    moe_tp: int,
    skip: tuple[str, ...] = (),
) -> Measured | None:
    """Fused-MoE latency (us) at the model's exact shape (hidden x inter x experts x top-k)."""
    raw = _raw(system, "moe")
    shape = f"{hidden}x{inter}x{experts}x{topk}"
    cands = _candidates(raw, engine, patterns, skip)
    for *_rank, key in cands:
        rows = (raw[key] or {}).get(shape)
        if not rows:
            continue
        tps = sorted({int(r[1]) for r in rows})
        tp = min(tps, key=lambda x: (abs(math.log(x / moe_tp)), x))
        pts = [(float(r[0]), float(r[2])) for r in rows if int(r[1]) == tp]
        if not pts:
            continue
        us = _extend(max(tokens, 1.0), pts)
        past = _past(tokens, max(p[0] for p in pts))
        note = "" if tp == moe_tp else f"measured at moe_tp={tp}, scaled to {moe_tp}"
        if tp != moe_tp:
            us *= tp / moe_tp if tp > moe_tp else 1.0  # more shards per rank -> less to read
        note = "; ".join(x for x in (note, past) if x)
        return Measured(key=key, us=us, exact=tp == moe_tp and not past, note=note)
    # no candidate holds the model's shape: the kernel's other shapes, by per-rank bytes
    for *_rank, key in cands:
        bpp = BYTES_PER_PARAM.get(key.rsplit("/", 1)[-1])
        if bpp is None:
            continue
        want = (hidden, inter, experts, topk, moe_tp)
        other = moe_other_shapes(raw[key] or {}, key, tokens, want, bpp)
        if other is not None:
            return Measured(key=key, us=other[0], exact=False, note=other[1])
    return None


def _curve(rows: list[list[float]], batch: float, context: float) -> float | None:
    """Latency (us) of one shape series at (batch, context): log-interpolated in both."""
    bs = sorted({int(r[0]) for r in rows})
    if not bs:
        return None
    per_b = []
    for b in bs:
        pts = [(float(r[1]), float(r[2])) for r in rows if int(r[0]) == b]
        per_b.append((float(b), _log_interp(max(context, 1.0), pts)))
    return _extend(max(batch, 1.0), per_b)  # past the last batch: along the last segment


def _physical(shape: str, rows: list[list[float]], kv_bytes: float, bw_GBps: float) -> bool:
    """False when a series reads its KV faster than the datasheet allows at its longest
    context (a broken measurement: e.g. SGLang 0.5.14's Triton rows at head dim 256 on the RTX
    PRO 6000 stay at 14.5 us from 1 to 131k tokens)."""
    if bw_GBps <= 0:
        return True
    _h, kv, d = (int(x) for x in shape.split("x"))
    b, ctx, us = max(rows, key=lambda r: (r[1] * r[0], -r[2]))
    nbytes = b * ctx * 2 * kv * d * kv_bytes
    return nbytes / (us * 1e3) <= 1.02 * bw_GBps


@cache
def _physical_shapes(system: str, key: str, bw_GBps: float) -> dict[str, list[list[float]]]:
    """The series of one attention table key that pass ``_physical`` (once per process: a
    what-if run asks for every attention op of every variant)."""
    kvb = 1.0 if key.endswith("/fp8") else 2.0
    rows = _raw(system, "attention")[key] or {}
    return {s: r for s, r in rows.items() if r and _physical(s, r, kvb, bw_GBps)}


def attention_measured(
    system: str,
    engine: str,
    patterns: list[tuple[str, str]],
    batch: float,
    context: float,
    heads: int,
    kv_heads: int,
    head_dim: int,
    bw_GBps: float = 0.0,
    kv_parallel: tuple[str, ...] = (),
    skip: tuple[str, ...] = (),
) -> Measured | None:
    """GQA decode attention (us) per layer at (heads, KV heads, head dim) per rank.

    Series that beat the datasheet bandwidth are dropped (``_physical``). Without the exact
    (KV heads, head dim) layout, the context-dependent part of the nearest layouts is scaled:
    linearly in head dim between the bracketing measured head dims, and by the KV-head ratio
    unless the kernel is one whose decode parallelism is bounded by its KV splits per head
    (``kv_parallel`` key patterns, e.g. SGLang's Triton decode: its per-layer time at a
    context does not grow with KV heads, kernels.yaml ``kv_parallel_attention``).
    """
    raw = _raw(system, "attention")
    want = f"{heads}x{kv_heads}x{head_dim}"
    for *_rank, key in _candidates(raw, engine, patterns, skip):
        shapes = _physical_shapes(system, key, bw_GBps)
        if want in shapes:
            us = _curve(shapes[want], batch, context)
            if us is not None:
                past = _past(batch, max(r[0] for r in shapes[want]), "sequences")
                return Measured(key=key, us=us, exact=not past, note=past)
            continue
        same = [s for s in shapes if s.split("x")[1:] == [str(kv_heads), str(head_dim)]]
        if same:
            shape = min(same, key=lambda s: abs(math.log(int(s.split("x")[0]) / heads)))
            us = _curve(shapes[shape], batch, context)
            if us is not None:
                return Measured(key=key, us=us, exact=False, note=f"nearest head count ({shape})")
            continue
        split = any(fnmatch.fnmatch(key.lower(), n.lower() + "*") for n in kv_parallel)
        est = _scaled_layout(shapes, batch, context, heads, kv_heads, head_dim, split)
        if est is not None:
            us, note = est
            return Measured(key=key, us=us, exact=False, note=note)
    return None


def _scaled_layout(
    shapes: dict[str, list[list[float]]],
    batch: float,
    context: float,
    heads: int,
    kv_heads: int,
    head_dim: int,
    split: bool,
) -> tuple[float, str] | None:
    """The layout's latency from measured layouts with other head dims / KV heads."""
    # head dim -> (t at ctx 1, context-dependent part, (layout distance, shape))
    by_dim: dict[int, tuple[float, float, tuple[float, str]]] = {}
    pool = [s for s in shapes if int(s.split("x")[1]) == kv_heads] or list(shapes)
    for s in pool:
        h, kv, d = (int(x) for x in s.split("x"))
        t_ctx = _curve(shapes[s], batch, context)
        t_one = _curve(shapes[s], batch, 1.0)
        if t_ctx is None or t_one is None:
            continue
        var = max(t_ctx - t_one, 0.0)
        if not split:
            var *= kv_heads / kv
        prev = by_dim.get(d)
        score = abs(math.log(h / heads)) + abs(math.log(kv / kv_heads))
        if prev is None or score < prev[2][0]:
            by_dim[d] = (t_one, var, (score, s))
    if not by_dim:
        return None
    dims = sorted(by_dim)
    lo = max((d for d in dims if d <= head_dim), default=None)
    hi = min((d for d in dims if d >= head_dim), default=None)
    if lo is not None and hi is not None and lo != hi:
        w = (head_dim - lo) / (hi - lo)
        t1 = by_dim[lo][0] + w * (by_dim[hi][0] - by_dim[lo][0])
        var = by_dim[lo][1] + w * (by_dim[hi][1] - by_dim[lo][1])
        src = f"{by_dim[lo][2][1]} and {by_dim[hi][2][1]}"
    else:
        near = lo if lo is not None else hi
        assert near is not None  # by_dim is not empty: one of the two exists
        t1, var = by_dim[near][0], by_dim[near][1] * head_dim / near
        src = by_dim[near][2][1]
    how = "per-KV-head split-limited" if split else "scaled by KV bytes"
    return t1 + var, f"no {heads}x{kv_heads}x{head_dim} rows: from {src} ({how})"


def mla_measured(
    system: str,
    engine: str,
    patterns: list[tuple[str, str]],
    batch: float,
    context: float,
    heads: int,
    skip: tuple[str, ...] = (),
) -> Measured | None:
    """MLA decode attention kernel (us) per layer at ``heads`` query heads per rank."""
    raw = _raw(system, "mla")
    for *_rank, key in _candidates(raw, engine, patterns, skip):
        shapes = raw[key] or {}
        if not shapes:
            continue
        shape = min(shapes, key=lambda s: abs(math.log(int(s) / heads)))
        rows = shapes[shape]
        bs = sorted({int(r[0]) for r in rows})
        if not bs:
            continue
        per_b = []
        for b in bs:
            pts = [(float(r[1]), float(r[2])) for r in rows if int(r[0]) == b]
            per_b.append((float(b), _log_interp(max(context, 1.0), pts)))
        us, past = _extend(max(batch, 1.0), per_b), _past(batch, bs[-1], "sequences")
        return Measured(key=key, us=us, exact=int(shape) == heads and not past, note=past)
    return None


def kernel_fit(
    system: str, family: str, engine: str, patterns: list[tuple[str, str]], batch: float
) -> Fit | None:
    """The line fit of one kernel (``family``: gemm, moe, attention, mla, gdn) at ``batch``."""
    data = system_fits(system)
    if data is None:
        return None
    table = data.family(family)
    for *_rank, key in _candidates(table, engine, patterns):
        return _at(table[key], batch)
    return None


def allreduce_points(system: str, impl_needles: list[str], n: int) -> list[list[float]] | None:
    """Measured (bytes, us) points of one allreduce implementation at world size ``n``."""
    data = system_fits(system)
    if data is None:
        return None
    best: tuple[tuple[int, ...], list[list[float]]] | None = None
    for key, per_n in data.comm.items():
        if str(n) not in per_n:
            continue
        low = key.lower()
        if any(needle.lower() in low for needle in impl_needles):
            ver = _vkey(key.split("/")[1])
            if best is None or ver > best[0]:
                best = (ver, per_n[str(n)])
    return best[1] if best else None


def interp_points(points: list[list[float]], nbytes: float) -> float:
    """Latency (us) at ``nbytes`` by log-log interpolation over measured points, read through
    a running minimum from above: t(s) = min over measured s' >= s.

    A smaller message can always be sent the way a larger one was (padded to it), so it takes
    at most the larger one's time. An allreduce table holds the engine's own one-shot ->
    two-shot switch (vLLM's custom allreduce at 8 ranks on the B200: 25.8 us at 128 KB, 26.1
    at 256 KB, 17.2 at 512 KB); read as measured, every message between fell, and the decode
    step with it as the batch grew (GLM-5 FP8, Llama-3.1-405B on the B200)."""
    pts = [list(p) for p in sorted(points)]
    for i in range(len(pts) - 2, -1, -1):
        pts[i][1] = min(pts[i][1], pts[i + 1][1])
    if nbytes <= pts[0][0]:
        return pts[0][1]
    if nbytes >= pts[-1][0]:
        b, t = pts[-1]
        return t * nbytes / b
    for (b0, t0), (b1, t1) in itertools.pairwise(pts):
        if b0 <= nbytes <= b1:
            if b1 == b0:
                return t0
            w = math.log(nbytes / b0) / math.log(b1 / b0)
            return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))
    return pts[-1][1]
