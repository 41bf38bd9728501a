"""predict --engine llamacpp against llama.cpp's measured decode step on one H200.

    .venv/bin/python bench/validation/llamacpp_h200.py [--out FILE.json]

Measured: llama-bench tg128 at depth 0 (-ngl 99 -fa 1, CUDA graphs on) of the random-weight
GGUFs that bench/gpu/llamacpp_cuda.sh build wrote on the H200 (bench/results/
2026-12-02_h200-llamacpp/call1/bench-*.json). Predicted: from the same files' headers (rebuilt
here with bench/gpu/random_gguf.py --header-only: the same shapes and type mix), priors only and
with the llama.cpp-kernel profile of test-backend-ops perf (call2/perf-types.sql). Nothing here
is fitted: the priors are the PyTorch-side kernel priors, the profile is per-op evidence, and the
measured rows are scored, never tuned against. Rows without a measurement (the held-out files
whose runs did not fit in the device budget) are listed with their prediction only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from ceiling.predict.llamacpp import predict_gguf, profile_from_sql  # noqa: E402
from ceiling.spec.hardware import load_gpu  # noqa: E402

RES = ROOT / "bench/results/2026-12-02_h200-llamacpp"
# file -> role: "beside": measured, and looked at while the model was written (nothing is
# fitted to them); "held-out": never looked at while writing it

FILES = {
    "llama3.1-8b-q4_k_m": "beside",
    "llama3.1-8b-f16": "beside",
    "qwen3-30b-a3b-q4_k_m": "beside",
    "llama3.1-8b-q8_0": "held-out",
    "llama3.1-8b-iq4_xs": "held-out",
    "llama3.1-8b-q5_k_m": "held-out",
    "llama3.1-70b-q4_k_m": "held-out",
}
CONTEXT = 64  # tg128 at depth 0: the mean context of its 128 tokens


def header(name: str, cache: Path) -> Path:
    shape, ftype = name.rsplit("-", 1)
    out = cache / f"{name}.gguf"
    if not out.exists():
        py = ROOT / ".engines/llamacpp/bin/python"
        subprocess.run([str(py), str(ROOT / "bench/gpu/random_gguf.py"), "--shape", shape,
                        "--ftype", ftype, "--out", str(out), "--header-only"],
                       check=True, capture_output=True)  # fmt: skip
    return out


def measured_ms(name: str) -> float | None:
    f = RES / "call1" / f"bench-{name}.json"
    if not f.exists():
        return None
    rows = [r for r in json.loads(f.read_text()) if r["n_depth"] == 0 and r["flash_attn"]]
    return 1000.0 / rows[0]["avg_ts"] if rows else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=RES / "predict_llamacpp.json")
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache/gguf-headers")
    a = ap.parse_args()
    a.cache.mkdir(parents=True, exist_ok=True)
    sql = RES / "call2/perf-types.sql"
    prof = profile_from_sql(sql.read_text(), source=str(sql.relative_to(ROOT)))
    bw = load_gpu("h200").mem_bw_GBps
    rows = []
    for name, role in FILES.items():
        gg = header(name, a.cache)
        prior = predict_gguf(gg, "h200", bw, CONTEXT)
        kern = predict_gguf(gg, "h200", bw, CONTEXT, profile=prof)
        m = measured_ms(name)
        assert kern.bound is not None  # predict --engine llamacpp always gives the bound
        prior_ms, kern_ms, bound_ms = (
            prior.decode_ms_per_token,
            kern.decode_ms_per_token,
            kern.bound.decode_ms_per_token,
        )
        row = {"file": name, "role": role, "measured_ms": m, "bound_ms": bound_ms,
               "prior_ms": prior_ms, "profile_ms": kern_ms}  # fmt: skip
        if m:
            row["prior_err_pct"] = (prior_ms - m) / m * 100
            row["profile_err_pct"] = (kern_ms - m) / m * 100
            row["measured_below_bound"] = m < bound_ms
        rows.append(row)
        err = (
            f"prior {row['prior_err_pct']:+.1f} %, profile {row['profile_err_pct']:+.1f} %"
            if m
            else "not measured"
        )
        print(f"{name:<22} {role:<8} measured {m or float('nan'):6.3f} ms  bound "
              f"{bound_ms:6.3f}  prior {prior_ms:6.3f}  profile {kern_ms:6.3f}  "
              f"{err}")  # fmt: skip
    a.out.write_text(json.dumps({"schema_version": 1, "gpu": "h200", "context": CONTEXT,
                                 "profile": prof.source, "rows": rows}, indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
