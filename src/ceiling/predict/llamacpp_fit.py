"""llama.cpp's decode mat-vec cost per weight type, fitted to its own kernels' timings at the
models' decode shapes (``test-backend-ops perf --test-file ... --output sql``).

A mat-vec at one token (ggml-cuda mmvq.cu, F16: mmvf.cu) costs a fixed part (the launch inside
the graph, the activation's q8_1 quantization, the grid's tail) and a part per byte of weights:

    time = t0 + bytes / rate

A rate measured on one 117 MB matrix (the first profile: perf-types.sql) leaves t0 out, and t0
is most of a small matrix's time (an 8B model's K and V matrices are 2.4 MB in Q4_K). So both
are fitted per type, from per-op timings only, never from an end-to-end step: least squares on
the relative residual (a 2 MB and a 1 GB matrix count alike), t0 >= 0. MUL_MAT_ID (the routed
experts of one token) is fitted apart, with the t0 of the same type's MUL_MAT (its measured
shapes all read the same bytes, so they cannot pin both numbers) and its own rate. The fit
reads only the per-op rows: which shapes were measured, and with what, is recorded with it.
"""

from __future__ import annotations

import re
from statistics import median

from pydantic import BaseModel, Field

from ceiling.predict.gguf import bits_per_weight, kernel_data

_SQL_INSERT = re.compile(r"^INSERT INTO test_backend_ops \((.*?)\) VALUES \((.*)\);\s*$")
_SQL_VALUE = re.compile(r"'((?:[^']|'')*)'|([^,\s][^,]*)")
# test-file mode names the op's tensors: "name=Kcur-0,...,sources=q4_K[4096,1024,1,1],f32[...]"
_SOURCE = re.compile(r"(\w+)\[(\d+),(\d+),(\d+),(\d+)\]")


class MatvecPoint(BaseModel):
    """One measured decode mat-vec: the weight's type and shape, bytes read, time per run."""

    op: str = Field(description="MUL_MAT or MUL_MAT_ID (routed experts)")
    type: str
    k: int = Field(description="input width (the weight's ne0)")
    m: int = Field(description="output rows (ne1)")
    used: int = Field(1, description="experts read per token (MUL_MAT_ID: the ids' width)")
    bytes: float
    time_us: float
    name: str = ""


class MatvecFit(BaseModel):
    """time_us = t0_us + bytes / (GBps x 1e3), for one op and weight type."""

    op: str
    type: str
    t0_us: float = Field(ge=0)
    GBps: float = Field(gt=0)
    points: int
    shapes: list[str]
    max_resid_pct: float = Field(description="largest |fit - measured| / measured of its points")
    t0_from: str = Field("fit", description="'fit', or the op whose t0 this one borrows")

    def time_us(self, nbytes: float) -> float:
        return self.t0_us + nbytes / (self.GBps * 1e3)


def sql_rows(text: str) -> list[dict[str, str]]:
    """The INSERT rows of test-backend-ops' SQL output, as column -> value."""
    rows = []
    for line in text.splitlines():
        m = _SQL_INSERT.match(line)
        if m:
            names = [c.strip() for c in m.group(1).split(",")]
            values = [a.replace("''", "'") if a else b.strip() for a, b in _SQL_VALUE.findall(m[2])]
            rows.append(dict(zip(names, values, strict=False)))
    return rows


def points_from_sql(text: str) -> list[MatvecPoint]:
    """The one-token MUL_MAT / MUL_MAT_ID rows of a test-file run (other rows are skipped)."""
    out = []
    for row in sql_rows(text):
        op, params = row.get("op_name", ""), row.get("op_params", "")
        if op not in ("MUL_MAT", "MUL_MAT_ID") or "sources=" not in params:
            continue
        if float(row.get("time_us") or 0) <= 0 or row.get("supported", "1") != "1":
            continue
        srcs = _SOURCE.findall(params.split("sources=", 1)[1])
        if len(srcs) < 2:
            continue
        typ, k, m = srcs[0][0].upper(), int(srcs[0][1]), int(srcs[0][2])
        if typ not in kernel_data().types:
            continue
        # one token: MUL_MAT's activation is [k, 1]; MUL_MAT_ID's [k, used] with ids [used, 1]
        used = int(srcs[2][1]) if op == "MUL_MAT_ID" and len(srcs) > 2 else 1
        tokens = int(srcs[2][2]) if op == "MUL_MAT_ID" and len(srcs) > 2 else int(srcs[1][2])
        if tokens != 1:
            continue
        name = re.search(r"name=([^,]*)", params)
        out.append(
            MatvecPoint(
                op=op,
                type=typ,
                k=k,
                m=m,
                used=used,
                bytes=used * k * m * bits_per_weight(typ) / 8.0,
                time_us=float(row["time_us"]),
                name=name.group(1) if name else "",
            )
        )
    return out


def _resid(fit: MatvecFit, pts: list[MatvecPoint]) -> float:
    return max(abs(fit.time_us(p.bytes) - p.time_us) / p.time_us * 100 for p in pts)


def _shapes(pts: list[MatvecPoint]) -> list[str]:
    return sorted({f"{p.k}x{p.m}" + (f"x{p.used}" if p.op == "MUL_MAT_ID" else "") for p in pts})


def fit_dense(typ: str, pts: list[MatvecPoint]) -> MatvecFit | None:
    """Least squares of time = t0 + bytes x s on relative residuals (weights 1 / time);
    None with fewer than two distinct sizes (one size cannot separate t0 from the rate)."""
    if len({p.bytes for p in pts}) < 2:
        return None
    # minimise sum ((t0 + s b - t) / t)^2: normal equations in (t0, s) with x = (1/t, b/t)
    a11 = sum(1 / p.time_us**2 for p in pts)
    a12 = sum(p.bytes / p.time_us**2 for p in pts)
    a22 = sum(p.bytes**2 / p.time_us**2 for p in pts)
    r1 = sum(1 / p.time_us for p in pts)
    r2 = sum(p.bytes / p.time_us for p in pts)
    det = a11 * a22 - a12 * a12
    t0, s = (r1 * a22 - r2 * a12) / det, (a11 * r2 - a12 * r1) / det
    if t0 < 0:  # no fixed cost left: the rate alone, same residuals
        t0, s = 0.0, r2 / a22
    fit = MatvecFit(
        op="MUL_MAT",
        type=typ,
        t0_us=t0,
        GBps=1 / s / 1e3,
        points=len(pts),
        shapes=_shapes(pts),
        max_resid_pct=0.0,
    )
    fit.max_resid_pct = _resid(fit, pts)
    return fit


def fit_experts(typ: str, pts: list[MatvecPoint], t0_us: float, t0_from: str) -> MatvecFit:
    """MUL_MAT_ID of ``typ``: the dense op's t0 (``t0_from``), the rate that fits the rest."""
    rest = [p.time_us - t0_us for p in pts]
    if min(rest) <= 0:  # the dense t0 is more than a routed op's whole time: no t0
        t0_us, t0_from, rest = 0.0, "none", [p.time_us for p in pts]
    rate = median(p.bytes / r for p, r in zip(pts, rest, strict=True)) / 1e3
    fit = MatvecFit(
        op="MUL_MAT_ID",
        type=typ,
        t0_us=t0_us,
        GBps=rate,
        points=len(pts),
        shapes=_shapes(pts),
        max_resid_pct=0.0,
        t0_from=t0_from,
    )
    fit.max_resid_pct = _resid(fit, pts)
    return fit


def fit_points(pts: list[MatvecPoint]) -> tuple[dict[str, MatvecFit], dict[str, MatvecFit]]:
    """(MUL_MAT fits, MUL_MAT_ID fits) by weight type. An expert type without a dense fit
    borrows the median t0 of the dense fits (t0_from names it)."""
    dense: dict[str, MatvecFit] = {}
    by_type: dict[tuple[str, str], list[MatvecPoint]] = {}
    for p in pts:
        by_type.setdefault((p.op, p.type), []).append(p)
    for (op, typ), group in sorted(by_type.items()):
        if op == "MUL_MAT" and (f := fit_dense(typ, group)) is not None:
            dense[typ] = f
    t0_all = median(f.t0_us for f in dense.values()) if dense else 0.0
    experts: dict[str, MatvecFit] = {}
    for (op, typ), group in sorted(by_type.items()):
        if op == "MUL_MAT_ID":
            own = dense.get(typ)
            experts[typ] = fit_experts(
                typ, group, own.t0_us if own else t0_all, "MUL_MAT" if own else "median MUL_MAT"
            )
    return dense, experts


def median_t0(fits: dict[str, MatvecFit]) -> float:
    """The fixed cost a type without its own fit borrows (the fitted types' median t0)."""
    return median(f.t0_us for f in fits.values()) if fits else 0.0
