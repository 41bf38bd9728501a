"""Build step of the aiconfigurator adapter: parquet tables -> line fits and raw decode rows.

The only code that reads aiconfigurator-core's files: which folders hold a system's tables, and
what their markers say, is decided by that package's own loader code
(``aiconfigurator_core.sdk.perf_database``), not by a glob of its folder layout; the parquet
files are read with pyarrow (declared in the ``tables`` extra).
See ``ceiling.predict.tables`` for what is kept and why.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from ceiling.predict.tables.core import (
    BYTES_PER_PARAM,
    KV_BYTES,
    RAW_GEMM_M,
    RAW_MAX_TOKENS,
    Fit,
    KernelFits,
    RawTable,
    SystemFits,
    SystemTables,
    _l2_bytes,
    info,
)


def fit_line(
    points: list[tuple[float, float]], key: str, l2_bytes: float = 128 * 2**20
) -> Fit | None:
    """Fit ``t = t0 + bytes/bw`` to (bytes, us) points, L2-aware (see the module docstring).

    The slope comes only from points whose bytes exceed 1.5x the L2 (streamed from DRAM, as in
    a real decode step); ``t0`` is the median excess over that line of the smallest points.
    Fewer than two streamed points: the fit has no slope (``bw_GBps`` 0) and only ``t0``.
    """
    if not points:
        return None
    pts = sorted(points)
    big = [(b, t) for b, t in pts if b >= max(1.5 * l2_bytes, 32e6)]
    slope = 0.0
    if len(big) >= 2:
        # least squares on relative error (each point weighted by 1/t^2)
        sw = sx = sy = sxx = sxy = 0.0
        for b, t in big:
            w = 1.0 / max(t, 1e-9) ** 2
            sw += w
            sx += w * b
            sy += w * t
            sxx += w * b * b
            sxy += w * b * t
        det = sw * sxx - sx * sx
        if det > 0:
            slope = max((sw * sxy - sx * sy) / det, 0.0)  # us per byte
        if slope <= 0:  # one line through the origin of the streamed points
            slope = sum(t / b for b, t in big) / len(big)
    # t0 from decode-sized matrices (1-16 MB) where there are some, else the smallest fifth
    n_small = max(2, len(pts) // 5)
    window = [(b, t) for b, t in pts if 1e6 <= b <= 16e6]
    base = window if len(window) >= 2 else pts[:n_small]
    small = sorted(t - b * slope for b, t in base)
    t0 = max(small[len(small) // 2], 1.0) if small else 1.0
    check = big if slope > 0 else base
    errs = sorted(abs(t0 + b * slope - t) / t for b, t in check if t > 0)
    rel = errs[len(errs) // 2] if errs else 0.0
    bw = 1e-3 / slope if slope > 0 else 0.0
    return Fit(key=key, t0_us=t0, bw_GBps=bw, rel_err=rel, points=len(pts))


def _read(path: Path, columns: list[str]) -> dict[str, list[Any]]:
    import pyarrow.parquet as pq  # the tables extra (heavy: only when building)

    table = pq.read_table(path)
    cols = [c for c in columns if c in table.column_names]
    return {c: table.column(c).to_pylist() for c in cols}


def _rows(data: dict[str, list[Any]]) -> list[dict[str, Any]]:
    keys = list(data)
    n = len(data[keys[0]]) if keys else 0
    return [{k: data[k][i] for k in keys} for i in range(n)]


def _gemm_fits(path: Path, tag: str, l2: float, raw: dict[str, RawTable]) -> KernelFits:
    rows = _rows(_read(path, ["kernel_source", "gemm_dtype", "m", "n", "k", "latency"]))
    groups: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for r in rows:
        if r["m"] > 1025:
            continue
        bpp = BYTES_PER_PARAM.get(r["gemm_dtype"])
        if bpp is None:
            continue
        key = (r["kernel_source"], r["gemm_dtype"], int(r["m"]))
        groups.setdefault(key, []).append((r["n"] * r["k"] * bpp, r["latency"] * 1e3))
        if r["m"] in RAW_GEMM_M:
            raw.setdefault(f"{tag}/{key[0]}/{key[1]}", {}).setdefault(str(key[2]), []).append(
                [int(r["n"]), int(r["k"]), round(r["latency"] * 1e3, 3)]
            )
    out: KernelFits = {}
    for (ks, dt, m), pts in groups.items():
        f = fit_line(pts, f"{tag}/{ks}/{dt}", l2)
        if f is not None:
            out.setdefault(f"{tag}/{ks}/{dt}", {})[str(m)] = f
    return out


def _moe_fits(path: Path, tag: str, l2: float, raw: dict[str, RawTable]) -> KernelFits:
    cols = ["kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk"]
    cols += ["num_experts", "moe_tp_size", "moe_ep_size", "distribution", "latency"]
    rows = _rows(_read(path, cols))
    groups: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for r in rows:
        if r["num_tokens"] > 512 or r.get("moe_ep_size", 1) != 1:
            continue
        if r.get("distribution", "balanced") not in ("balanced", "uniform"):
            continue
        bpp = BYTES_PER_PARAM.get(r["moe_dtype"])
        if bpp is None:
            continue
        active = min(r["num_experts"], r["num_tokens"] * r["topk"])
        nbytes = active * 3 * r["hidden_size"] * r["inter_size"] / r["moe_tp_size"] * bpp
        key = (r["kernel_source"], r["moe_dtype"], int(r["num_tokens"]))
        groups.setdefault(key, []).append((nbytes, r["latency"] * 1e3))
        if r["num_tokens"] <= RAW_MAX_TOKENS:
            shape = f"{r['hidden_size']}x{r['inter_size']}x{r['num_experts']}x{r['topk']}"
            raw.setdefault(f"{tag}/{key[0]}/{key[1]}", {}).setdefault(shape, []).append(
                [int(r["num_tokens"]), int(r["moe_tp_size"]), round(r["latency"] * 1e3, 3)]
            )
    out: KernelFits = {}
    for (ks, dt, t), pts in groups.items():
        f = fit_line(pts, f"{tag}/{ks}/{dt}", l2)
        if f is not None:
            out.setdefault(f"{tag}/{ks}/{dt}", {})[str(t)] = f
    return out


def _attn_fits(path: Path, tag: str, kind: str, l2: float, raw: dict[str, RawTable]) -> KernelFits:
    """GQA / MLA decode attention: latency vs KV bytes read, per batch size."""
    if kind == "gqa":
        cols = ["kernel_source", "kv_cache_dtype", "batch_size", "num_key_value_heads"]
        cols += ["num_heads", "head_dim", "step", "window_size", "latency"]
    else:
        cols = ["kernel_source", "kv_cache_dtype", "batch_size", "isl", "step", "num_heads"]
        cols += ["latency"]
    rows = _rows(_read(path, cols))
    groups: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for r in rows:
        if r["batch_size"] > 256 or r.get("window_size", 0):
            continue
        kvb = KV_BYTES.get(r["kv_cache_dtype"])
        if kvb is None:
            continue
        ctx = r["step"] + r.get("isl", 0)
        per_tok = (
            2 * r["num_key_value_heads"] * r["head_dim"] if kind == "gqa" else 576
        )  # MLA latent (kv_lora 512 + rope 64) of the DeepSeek shape the tables use
        nbytes = r["batch_size"] * ctx * per_tok * kvb
        key = (r["kernel_source"], r["kv_cache_dtype"], int(r["batch_size"]))
        groups.setdefault(key, []).append((nbytes, r["latency"] * 1e3))
        if r["batch_size"] <= RAW_MAX_TOKENS:
            if kind == "gqa":
                shape = f"{r['num_heads']}x{r['num_key_value_heads']}x{r['head_dim']}"
            else:
                shape = f"{r['num_heads']}"
            raw.setdefault(f"{tag}/{key[0]}/{key[1]}", {}).setdefault(shape, []).append(
                [int(r["batch_size"]), int(ctx), round(r["latency"] * 1e3, 3)]
            )
    out: KernelFits = {}
    for (ks, dt, b), pts in groups.items():
        f = fit_line(pts, f"{tag}/{ks}/{dt}", l2)
        if f is not None:
            out.setdefault(f"{tag}/{ks}/{dt}", {})[str(b)] = f
    return out


def _gdn_fits(path: Path, tag: str, l2: float) -> KernelFits:
    cols = ["kernel_source", "phase", "batch_size", "num_v_heads", "head_k_dim", "head_v_dim"]
    rows = _rows(_read(path, [*cols, "latency"]))
    groups: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r.get("phase") not in ("generation", "decode") or r["batch_size"] > 256:
            continue
        state = r["batch_size"] * r["num_v_heads"] * r["head_k_dim"] * r["head_v_dim"] * 4
        groups.setdefault(r["kernel_source"], []).append((2 * state, r["latency"] * 1e3))
    out: KernelFits = {}
    for ks, pts in groups.items():
        f = fit_line(pts, f"{tag}/{ks}", l2)
        if f is not None:
            out[f"{tag}/{ks}"] = {"any": f}
    return out


def _comm_points(path: Path, tag: str) -> dict[str, dict[str, list[list[float]]]]:
    cols = ["op_name", "kernel_source", "num_gpus", "message_size", "latency"]
    rows = _rows(_read(path, cols))
    out: dict[str, dict[str, list[list[float]]]] = {}
    for r in rows:
        if r["op_name"] not in ("all_reduce", "allreduce", "AllReduce"):
            continue
        key = f"{tag}/{r['kernel_source']}"
        out.setdefault(key, {}).setdefault(str(r["num_gpus"]), []).append(
            [float(r["message_size"]), r["latency"] * 1e3]
        )
    for per_n in out.values():
        for pts in per_n.values():
            pts.sort()
    return out


def version_dirs(root: Path) -> list[tuple[Path, str, bool, frozenset[str]]]:
    """(folder, op family, usable, partial tables) of every ``<family>/<backend>/<version>``
    folder of one system, found and judged by aiconfigurator's own loader: its layout rules
    (family layout; legacy ``<backend>/<version>`` folders have no op family and are left out)
    and its markers (``collection_meta.yaml`` partial tables: their rows are used, and said;
    a legacy ``INCOMPLETE.txt``: the folder is not used). Private functions of a pinned
    version (``PINNED``): its public API loads tables into query objects, not rows."""
    from aiconfigurator_core.sdk import perf_database as pdb  # optional extra, when building

    out = []
    for backend in sorted(pdb.KNOWN_BACKEND_DIRS):  # engines and collective libraries (nccl)
        for _version, vpath in pdb._iter_backend_version_dirs(str(root), backend):
            rel = Path(vpath).relative_to(root).parts
            if len(rel) != 3:
                continue
            state = pdb._version_dir_state(vpath, data_dir=str(root))
            partial: frozenset[str] = frozenset(cast("Iterable[str]", state["partial_tables"]))
            out.append((Path(vpath), rel[0], not state["unusable"], partial))
    return sorted(out)


def build_system(system: str) -> SystemTables:
    """Read one system's parquet tables into fits (slow: pyarrow); see :func:`system_fits`."""
    tinfo = info()
    if tinfo is None:
        raise RuntimeError("aiconfigurator-core is not installed")
    return build_root(Path(tinfo.root) / system, system, tinfo.version)


def build_root(root: Path, system: str, version: str) -> SystemTables:
    """The fits of the system whose tables are under ``root`` (see :func:`build_system`)."""
    l2 = _l2_bytes(system)
    result = SystemTables(
        fits=SystemFits(system=system, version=version),
        raw={"gemm": {}, "moe": {}, "attention": {}, "mla": {}},
    )
    for folder, op, usable, partial in version_dirs(root):
        rel = folder.relative_to(root)
        if not usable:
            result.fits.skipped.append(f"{rel}: marked incomplete (INCOMPLETE.txt)")
            continue
        if partial:
            result.fits.partial.extend(f"{rel}/{t}" for t in sorted(partial))
        for path in sorted(folder.glob("*.parquet")):
            _read_table(result, path, op, f"{folder.parent.name}/{folder.name}", root, l2)
    return result


def _read_table(result: SystemTables, path: Path, op: str, tag: str, root: Path, l2: float) -> None:
    """Fit one parquet table into ``result`` (a malformed one is skipped, named)."""
    fits, raw = result.fits, result.raw
    name = path.name
    try:
        if op == "gemm" and name == "gemm_perf.parquet":
            fits.gemm.update(_gemm_fits(path, tag, l2, raw["gemm"]))
        elif op == "moe" and name == "moe_perf.parquet":
            fits.moe.update(_moe_fits(path, tag, l2, raw["moe"]))
        elif op == "attention" and name == "generation_attention_perf.parquet":
            fits.attention.update(_attn_fits(path, tag, "gqa", l2, raw["attention"]))
        elif op == "mla" and name == "generation_mla_perf.parquet":
            fits.mla.update(_attn_fits(path, tag, "mla", l2, raw["mla"]))
        elif op == "linear_attention" and name == "gdn_perf.parquet":
            fits.gdn.update(_gdn_fits(path, tag, l2))
        elif op == "comm" and name.endswith("_perf.parquet"):
            fits.comm.update(_comm_points(path, tag))
    except (KeyError, ValueError, OSError) as exc:  # a malformed table is skipped, named
        fits.skipped.append(f"{path.relative_to(root)}: {exc}")
