"""predict (with a calibrated profile) beside measured H200 decode steps.

Measured sources: ``../shared/data/h200_probe.json`` (a Llama-8B-shaped and a Qwen-32B-shaped
bf16 step, ctx 1024, graph and eager) and any ``experiments/gpu/tp_decode.py`` result files. predict runs
here, on the CPU, with the current code, so the table can be re-made after predict changes.

    python experiments/gpu/gpu_compare.py --profile experiments/results/<dir>/profile.json \
        --tp-decode experiments/results/<dir>/tp1_dense.json [--out compare.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

PROBE_CASES = {  # h200_probe.json key -> (catalog model, batch)
    "llama8b_shape": ("llama-3.1-8b", 1),
    "llama8b_shape_bs16": ("llama-3.1-8b", 16),
    "qwen32b_shape": ("qwen3-32b", 1),
}


def predicted(model: str, batch: int, tp: int, profile: str | None, graphs: bool) -> dict:
    from ceiling.predict.api import PredictRequest, predict

    p = predict(
        PredictRequest(
            model=model,
            gpu="h200",
            tp=tp,
            batch=batch,
            context=1024,
            cuda_graphs=graphs,
            profile=profile,
        )
    ).model_dump()
    return {"ms": p["decode_ms_per_token"], "components_ms": p["components_ms"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", required=True)
    ap.add_argument("--probe", default=str(ROOT.parent / "shared" / "data" / "h200_probe.json"))
    ap.add_argument("--tp-decode", nargs="*", default=[])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = []
    probe = json.loads(Path(args.probe).read_text()) if Path(args.probe).is_file() else {}
    for key, (model, batch) in PROBE_CASES.items():
        if key in probe:
            rows.append(
                {
                    "source": "h200_probe.json",
                    "model": model,
                    "tp": 1,
                    "batch": batch,
                    "graph_ms": probe[key]["graph_ms"],
                    "eager_ms": probe[key]["eager_ms"],
                }
            )
    for f in args.tp_decode:
        for r in json.loads(Path(f).read_text())["rows"]:
            if "error" in r or r.get("predicted_error", "").startswith("--layers"):
                continue
            rows.append(
                {
                    "source": Path(f).name,
                    "model": r["model"],
                    "tp": r["tp"],
                    "batch": r["batch"],
                    "graph_ms": r["graph_ms"],
                    "eager_ms": r["eager_ms"],
                }
            )
    print(f"profile: {args.profile}")
    print(
        "| measured by | model shape | TP | B | graph ms | predicted | err % | eager ms | predicted | err % |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        g = predicted(r["model"], r["batch"], r["tp"], args.profile, True)
        e = predicted(r["model"], r["batch"], r["tp"], args.profile, False)
        r.update(pred_graph=g, pred_eager=e)
        r["err_graph_pct"] = round(100 * (g["ms"] - r["graph_ms"]) / r["graph_ms"], 1)
        r["err_eager_pct"] = round(100 * (e["ms"] - r["eager_ms"]) / r["eager_ms"], 1)
        print(
            f"| {r['source']} | {r['model']} | {r['tp']} | {r['batch']} | {r['graph_ms']:.2f} | "
            f"{g['ms']:.2f} | {r['err_graph_pct']:+.1f} | {r['eager_ms']:.2f} | {e['ms']:.2f} | "
            f"{r['err_eager_pct']:+.1f} |"
        )
    if args.out:
        args.out.write_text(json.dumps({"profile": args.profile, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
