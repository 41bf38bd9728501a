"""predict --engine llamacpp against llama.cpp's measured decode step on one H200.

    .venv/bin/python experiments/validation/llamacpp_h200.py [--out FILE.json]
    .venv/bin/python experiments/validation/llamacpp_h200.py --preregister FILE.json  # before a run

Measured: llama-bench tg128 at depth 0 (-ngl 99 -fa 1, CUDA graphs on) of random-weight GGUFs
written on the H200 (experiments/results/2026-12-02_h200-llamacpp/call1/, call3/ and call4/
bench-*.json).
Predicted from the same files' headers (rebuilt here with experiments/gpu/random_gguf.py --header-only:
the same shapes and type mix): priors only, the one-shape profile (call2/perf-types.sql) and the
refit (METHOD below, on call3/matvec.sql). Nothing is fitted to a measured step: the priors are
the PyTorch-side kernel priors, the profiles per-op evidence. Held-out rows were predicted and
committed (--preregister) before their run; rows without a measurement carry predictions only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from ceiling.predict.llamacpp import profile_from_sql  # noqa: E402
from ceiling.predict.llamacpp_files import predict_gguf  # noqa: E402
from ceiling.spec.hardware import load_gpu  # noqa: E402

RES = ROOT / "experiments/results/2026-12-02_h200-llamacpp"
# file -> role: "beside": measured, and looked at while the model was written (nothing is
# fitted to them); "held-out": never looked at while writing it, its predictions committed
# before its run (heldout_preregistered.json)
FILES = {
    "llama3.1-8b-q4_k_m": "beside",
    "llama3.1-8b-f16": "beside",
    "qwen3-30b-a3b-q4_k_m": "beside",
    "llama3.1-8b-q8_0": "held-out",
    "mistral-nemo-12b-q5_k_m": "held-out",
    "mixtral-8x7b-q4_k_m": "held-out",
    "qwen3-32b-q4_k_m": "held-out",
    "llama3.1-8b-iq4_xs": "held-out",
    "llama3.1-8b-q6_k": "held-out",
    "llama3.1-8b-q5_k_m": "held-out",
    "llama3.1-70b-q4_k_m": "held-out",
}
CONTEXT = 64  # tg128 at depth 0: the mean context of its 128 tokens
TYPES_SQL = RES / "call2/perf-types.sql"  # one 4096 x 14336 mat-vec per type (profile 1)
MATVEC_SQL = RES / "call3/matvec.sql"  # the models' decode shapes (the refit, profile 2)
# the refit's method, fixed before the run that measured the held-out files
METHOD = (
    "profile 2 = calibrate --engine llamacpp --from-output on perf-types.sql + call3/matvec.sql: "
    "per type, MUL_MAT time = t0 + bytes / rate by least squares on relative residuals over "
    "the decode shapes of experiments/gpu/ops/matvec-*.txt (t0 >= 0); MUL_MAT_ID: the same type's "
    "t0, its own rate (median over its shapes); a type with no decode-shape fit: its "
    "perf-types rate + the median t0 of the fitted types; the embedding row without t0; KV "
    "and small kernels keep their priors. Fitted to per-op rows only, never to a step."
)


def header(name: str, cache: Path) -> Path:
    """The header of the GGUF ``name`` (SHAPE-FTYPE) as random_gguf.py writes it, kept in
    ``cache``; written with this interpreter (ceiling's .venv has gguf, the dev extra)."""
    shape, ftype = name.rsplit("-", 1)
    out = cache / f"{name}.gguf"
    if not out.exists():
        subprocess.run([sys.executable, str(ROOT / "experiments/gpu/random_gguf.py"),
                        "--shape", shape, "--ftype", ftype, "--out", str(out), "--header-only"],
                       check=True, capture_output=True)  # fmt: skip
    return out


def _tg_ms(f: Path) -> float | None:
    if not f.exists() or not f.read_text().strip():
        return None
    rows = [r for r in json.loads(f.read_text()) if r["n_depth"] == 0 and r["flash_attn"]]
    return 1000.0 / rows[0]["avg_ts"] if rows else None


def measured_ms(name: str) -> tuple[float | None, float | None]:
    """(the first measurement of the file, the next one where a later call measured it again):
    calls 1, 3 and 4 (2026-12-04: the held-out files call 3 had no time for)."""
    found = [
        m for c in ("call1", "call3", "call4") if (m := _tg_ms(RES / c / f"bench-{name}.json"))
    ]
    return (found[0] if found else None), (found[1] if len(found) > 1 else None)


def _err(pred: float, m: float | None) -> float | None:
    return (pred - m) / m * 100 if m else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=RES / "predict_llamacpp.json")
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache/gguf-headers")
    ap.add_argument(
        "--preregister",
        type=Path,
        help="write the held-out files' predictions (priors, profile 1) here, nothing measured",
    )
    a = ap.parse_args()
    a.cache.mkdir(parents=True, exist_ok=True)
    prof = profile_from_sql(TYPES_SQL.read_text(), source=str(TYPES_SQL.relative_to(ROOT)))
    refit = None
    if MATVEC_SQL.exists() and not a.preregister:
        refit = profile_from_sql(
            TYPES_SQL.read_text() + "\n" + MATVEC_SQL.read_text(),
            source=f"{TYPES_SQL.relative_to(ROOT)} + {MATVEC_SQL.relative_to(ROOT)}",
            with_fits=True,
        )
    bw = load_gpu("h200").mem_bw_GBps
    rows = []
    for name, role in FILES.items():
        if a.preregister and role != "held-out":
            continue
        gg = header(name, a.cache)
        prior = predict_gguf(gg, "h200", bw, CONTEXT)
        kern = predict_gguf(gg, "h200", bw, CONTEXT, profile=prof)
        assert kern.bound is not None  # predict --engine llamacpp always gives the bound
        row: dict[str, object] = {
            "file": name,
            "role": role,
            "bytes_per_token": kern.details.llamacpp.bytes_per_token
            if kern.details.llamacpp
            else None,
            "bound_ms": kern.bound.decode_ms_per_token,
            "prior_ms": prior.decode_ms_per_token,
            "profile_ms": kern.decode_ms_per_token,
        }
        if refit is not None:
            row["refit_ms"] = predict_gguf(
                gg, "h200", bw, CONTEXT, profile=refit
            ).decode_ms_per_token
        if not a.preregister:
            m, again = measured_ms(name)
            row["measured_ms"], row["remeasured_ms"] = m, again
            if m:
                for k in ("prior", "profile", "refit"):
                    if f"{k}_ms" in row:
                        row[f"{k}_err_pct"] = _err(float(row[f"{k}_ms"]), m)  # type: ignore[arg-type]
                row["measured_below_bound"] = m < float(row["bound_ms"])  # type: ignore[arg-type]
        rows.append(row)
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in row.items()))  # fmt: skip
    if a.preregister:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
        doc = {"schema_version": 1, "gpu": "h200", "context": CONTEXT,
               "written_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "code_at": head, "profile": prof.source, "refit_method": METHOD, "rows": rows}  # fmt: skip
        a.preregister.write_text(json.dumps(doc, indent=2) + "\n")
        return 0
    a.out.write_text(json.dumps({"schema_version": 2, "gpu": "h200", "context": CONTEXT,
                                 "profile": prof.source,
                                 "refit": refit.source if refit else None,
                                 "refit_method": METHOD, "rows": rows}, indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
