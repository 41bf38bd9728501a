"""Markdown summary of a multi-GPU session (issue 7): fitted alpha/beta per link kind, world size
and variant; per-token allreduce cost; TP decode steps beside predict.

    python experiments/gpu/multi_gpu_report.py experiments/results/<dir>/commbench.json \
        experiments/results/<dir>/tp_decode_*.json > experiments/results/<dir>.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _fits(doc: dict) -> list[str]:
    out = [
        "| link | world | variant | eager alpha us | eager beta GB/s | graph alpha us | graph beta GB/s | 14 KB eager / graph us | checks |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in doc["runs"]:
        if run.get("error"):
            out.append(
                f"| {run.get('link')} | {run['world_size']} | {run['variant']} | failed: {run['error'][:120]} |||||"
            )
            continue
        f = {x["in_cuda_graph"]: x for x in run["fits"]}
        e, g = f.get(False), f.get(True)
        row14 = min(run["rows"], key=lambda r: abs(r["size_bytes"] - 14336))
        ok = "ok" if all(r["correct"] for r in run["rows"]) else "WRONG"

        def num(x, k):
            return "-" if x is None else (f"{x[k]:.3g}" if x[k] < 1e8 else "inf")

        gt = row14.get("graph_time_us")
        out.append(
            f"| {run.get('link') or '-'} | {run['world_size']} | {run['variant']} | {num(e, 'alpha_us')} | "
            f"{num(e, 'beta_GBps')} | {num(g, 'alpha_us')} | {num(g, 'beta_GBps')} | "
            f"{row14['time_us']:.1f} / {'-' if gt is None else f'{gt:.1f}'} | {ok} |"
        )
    return out


def _token(doc: dict) -> list[str]:
    mc = doc.get("model_cost")
    if not mc:
        return []
    out = [
        f"\nPer-token allreduce cost, {mc['model']} ({mc['allreduces_per_token']} allreduces of "
        f"{mc['hidden']} x 2 bytes per token at B=1, TP = world size):\n",
        "| variant | TP | mode | us each | ms/token | vs default |",
        "|---|---|---|---|---|---|",
    ]
    for r in mc["rows"]:
        d = r.get("delta_vs_default_pct")
        out.append(
            f"| {r['variant']} | {r['world_size']} | {'graph' if r['in_cuda_graph'] else 'eager'} | "
            f"{r['latency_us']:.2f} | {r['per_token_ms']:.3f} | {'-' if d is None else f'{d:+.1f} %'} |"
        )
    return out


def _tp(doc: dict) -> list[str]:
    out = [
        "| model | TP | split | variant | graph ms | predicted | err | eager ms | predicted | "
        "collectives in step (graph) ms | weights GB/rank | check |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        split = r.get("parallel", "tp")
        if "error" in r:
            out.append(
                f"| {r['model']} | {r['tp']} | {split} | {r['variant']} | "
                f"failed: {r['error'][:160]} |||||||"
            )
            continue

        def ms(k, r=r):
            v = r.get(k)
            return "-" if v is None else f"{v:.3f}"

        g, pg = r.get("graph_ms"), r.get("predicted_graph_ms")
        err = "-" if not g or not pg else f"{100 * (pg - g) / g:+.1f} %"
        ok = "ok" if r.get("finite") and r.get("ranks_consistent") else "FAILED"
        out.append(
            f"| {r['model']} | {r['tp']} | {split} | {r['variant']} | {ms('graph_ms')} | "
            f"{ms('predicted_graph_ms')} | {err} | {ms('eager_ms')} | {ms('predicted_eager_ms')} | "
            f"{ms('comm_in_step_graph_ms')} | {r['weights_GB_per_rank']:.1f} | {ok} |"
        )
    if doc.get("running"):
        run = doc["running"]
        out.append(
            f"\ncut off while running {run['model']} TP={run['tp']} {run.get('parallel', 'tp')} "
            f"{run['variant']}: no row for it"
        )
    return out


def main(paths: list[str]) -> int:
    lines: list[str] = []
    for p in paths:
        if not Path(p).is_file():  # a part that was cut off or never ran: say so, go on
            lines.append(f"\n## {Path(p).name}\n\nmissing: that step left no file\n")
            continue
        doc = json.loads(Path(p).read_text())
        lines.append(f"\n## {Path(p).name}\n")
        if "runs" in doc:
            lines += [
                f"{doc['backend']} on {doc['device']}, torch {doc.get('torch_version')}, "
                f"NCCL {doc.get('nccl_version')}, links {doc.get('topology_links')}\n"
            ]
            lines += _fits(doc) + _token(doc)
        elif "rows" in doc:
            lines += [f"link {doc.get('link')}, profile {doc.get('profile')}\n", *_tp(doc)]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
