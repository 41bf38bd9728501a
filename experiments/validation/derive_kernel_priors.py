"""Derive predict's kernel priors (data/predict/kernel_priors.yaml) from aiconfigurator's tables.

The priors are what ``predict`` uses for an op when neither a measured profile nor the tables
(optional extra) describe it: per GPU class and kernel family, a fixed cost ``t0_us`` and a
bandwidth efficiency ``eff`` (achieved / datasheet), so that one op takes
``t0_us + bytes / (eff x datasheet bandwidth)``. They are fitted to per-operation measurements
(aiconfigurator-core's tables, per GPU system and engine), never to end-to-end decode results.

For each class (the GPUs of that class that have tables) and family, the script gathers the
line fits (``ceiling.predict.tables``) of every engine's kernel for that family at batch 1,
drops fits that fail the table quality check, and takes medians. MoE fixed costs grow with the
hidden size (routing, scatter, activation quantization: the RTX PRO 6000 NVFP4 MoE floor goes
from ~48 us at hidden 2048 to ~82 us at 7168), so MoE priors are ``t0_us + t0_per_khidden_us x
hidden / 1000``, regressed over the model shapes the tables hold, at their smallest per-rank
slice.

    pip install 'ceiling[tables]'
    python experiments/validation/derive_kernel_priors.py [--out src/ceiling/data/predict/kernel_priors.yaml]

Prints the table of what it fitted and writes the YAML (with the package version in it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import yaml

from ceiling.predict import tables
from ceiling.spec._data import load_yaml

CLASSES = {
    "hopper": ["h100_sxm", "h200_sxm"],
    "blackwell": ["b200_sxm", "b300_sxm", "gb200"],
    "blackwell_sm120": ["rtx_pro_6000_server"],
    "ada": ["l40s"],
    "ampere": ["a100_sxm"],
}
FAMILY_KIND = {"gemm": "gemm", "moe": "moe", "attention": "attention", "mla": "mla", "gdn": "gdn"}


def _datasheet_bw(system: str) -> float:
    bw = tables.system_bw_GBps(system)
    if bw:
        return bw
    for e in load_yaml("gpus.yaml").values():
        if isinstance(e, dict) and e.get("aic_system") == system:
            return float(e["mem_bw_GBps"])
    raise SystemExit(f"no catalog GPU maps to {system}")


def _patterns(family: str, arch_class: str) -> list[tuple[str, str]]:
    """Every engine's table patterns for one family on one class."""
    kernels = load_yaml("predict/kernels.yaml")
    out: list[tuple[str, str]] = []
    for per_family in kernels["tables"].values():
        rule = per_family.get(family) or {}
        for needle, dtype in rule.get(arch_class) or rule.get("default") or []:
            if (needle, dtype) not in out:
                out.append((needle, dtype))
    return out


def _table_kind(family: str) -> str:
    kind = load_yaml("predict/kernels.yaml")["families"][family]["kind"]
    return {"gemm": "gemm", "moe": "moe", "attention": "attention", "mla": "mla", "gdn": "gdn"}[
        kind
    ]


def _newest(table: dict) -> dict:
    """Only each engine's newest version (the one its users run; older ones linger in the data)."""
    best: dict[str, tuple[int, ...]] = {}
    for key in table:
        eng, ver = key.split("/")[:2]
        best[eng] = max(best.get(eng, ()), tables._vkey(ver))
    return {
        k: v for k, v in table.items() if tables._vkey(k.split("/")[1]) == best[k.split("/")[0]]
    }


def _fits(system: str, family: str, arch_class: str, batch: float) -> list[tables.Fit]:
    data = tables.system_fits(system)
    table = _newest(data.family(_table_kind(family)) if data else {})
    out = []
    for needle, dtype in _patterns(family, arch_class):
        for key, per_batch in table.items():
            rest = "/".join(key.split("/")[2:])
            if needle.lower() in rest.lower() and (not dtype or rest.endswith("/" + dtype)):
                f = tables._at(per_batch, batch)
                if f not in out:
                    out.append(f)
    bw = _datasheet_bw(system)
    return [tables.quality(f, out, bw) for f in out]


def _moe_hidden_slope(system: str, family: str, arch_class: str, eff_bw: float) -> tuple:
    """(a, b): fixed cost a + b x hidden/1000 (us) from the smallest per-rank slices."""
    raw = _newest(tables._raw(system, "moe"))
    pts = []
    for needle, dtype in _patterns(family, arch_class):
        for key, shapes in raw.items():
            rest = "/".join(key.split("/")[2:])
            if not (needle.lower() in rest.lower() and rest.endswith("/" + dtype)):
                continue
            bpp = tables.BYTES_PER_PARAM.get(dtype, 1.0)
            for shape, rows in shapes.items():
                h, inter, _e, k = (int(x) for x in shape.split("x"))
                ones = [r for r in rows if int(r[0]) == 1]
                if not ones:
                    continue
                tp_max = max(int(r[1]) for r in ones)
                us = min(float(r[2]) for r in ones if int(r[1]) == tp_max)
                nbytes = k * 3 * h * inter / tp_max * bpp
                pts.append((h / 1000, us - nbytes / (eff_bw * 1e3)))
        if pts:
            break
    if len(pts) < 3:
        return None
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    b = max(b, 0.0)
    return my - b * mx, b


def derive() -> dict:
    info = tables.info()
    if info is None:
        raise SystemExit("aiconfigurator-core is not installed: pip install 'ceiling[tables]'")
    families = load_yaml("predict/kernels.yaml")["families"]
    out: dict = {
        "schema_version": 1,
        "source": f"experiments/validation/derive_kernel_priors.py over aiconfigurator-core {info.version} tables "
        "(per-operation measurements; medians over the GPUs of each class and the engines' "
        "kernels of each family at batch 1)",
        "classes": {},
    }
    for arch_class, systems in CLASSES.items():
        entry: dict = {}
        for family in families:
            t0s, effs, t0_b8, keys, effs64, t0_b64 = [], [], [], [], [], []
            slopes = []
            for system in systems:
                if tables.system_fits(system) is None:
                    continue
                bw = _datasheet_bw(system)
                for f in _fits(system, family, arch_class, 1):
                    if not f.trusted:
                        continue
                    t0s.append(f.t0_us)
                    keys.append(f"{system}:{f.key}")
                    if f.bw_GBps > 0:
                        effs.append(min(f.bw_GBps / bw, 1.0))
                for f in _fits(system, family, arch_class, 8):
                    if f.trusted:
                        t0_b8.append(f.t0_us)
                for f in _fits(system, family, arch_class, 64):
                    if f.trusted and f.bw_GBps > 0:
                        effs64.append(min(f.bw_GBps / bw, 1.0))
                        t0_b64.append(f.t0_us)
                if families[family]["kind"] == "moe" and effs:
                    s = _moe_hidden_slope(system, family, arch_class, statistics.median(effs) * bw)
                    if s:
                        slopes.append(s)
            if not t0s:
                continue
            rec: dict = {"t0_us": round(max(statistics.median(t0s), 1.0), 2)}
            if effs:
                rec["eff"] = round(statistics.median(effs), 3)
            if t0_b8:
                rec["t0_per_token_us"] = round(
                    max(statistics.median(t0_b8) - rec["t0_us"], 0.0) / 7, 3
                )
            if effs64:
                rec["eff_64"] = round(statistics.median(effs64), 3)
                rec["t0_64_us"] = round(statistics.median(t0_b64), 2)
            if slopes:
                rec["t0_us"] = round(max(statistics.median(a for a, _ in slopes), 1.0), 2)
                rec["t0_per_khidden_us"] = round(statistics.median(b for _, b in slopes), 2)
            rec["n"] = len(t0s)
            rec["from"] = sorted(set(keys))[:4]
            entry[family] = rec
        out["classes"][arch_class] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "src/ceiling/data/predict/kernel_priors.yaml",
    )
    args = ap.parse_args(argv)
    data = derive()
    print(f"{'class':16} {'family':15} {'t0 us':>7} {'/khid':>6} {'/tok':>6} {'eff':>6} {'n':>3}")
    for cls, fams in data["classes"].items():
        for fam, r in fams.items():
            print(
                f"{cls:16} {fam:15} {r['t0_us']:7.1f} {r.get('t0_per_khidden_us', 0):6.1f} "
                f"{r.get('t0_per_token_us', 0):6.2f} {r.get('eff', float('nan')):6.2f} {r['n']:3}"
            )
    header = (
        "# Kernel priors: fixed cost and bandwidth efficiency per GPU class and kernel family.\n"
        "# GENERATED by experiments/validation/derive_kernel_priors.py from per-operation tables; do not edit by\n"
        "# hand (re-run the script). One op takes t0_us (+ t0_per_khidden_us x hidden/1000 for\n"
        "# MoE, + t0_per_token_us x (tokens-1)) + bytes / (eff x datasheet bandwidth); at 64\n"
        "# tokens and more the fit at 64 (t0_64_us, eff_64) where the tables have it,\n"
        "# log-interpolated in between.\n"
    )
    args.out.write_text(header + yaml.safe_dump(data, sort_keys=False, width=100))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
