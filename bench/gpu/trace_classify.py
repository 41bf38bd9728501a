"""Classify the traces ``bench/gpu/trace_decode.py`` brought back, with ``ceiling.trace``, and
set each split against the same steps timed with CUDA events (issue 23's GPU evidence).

    python bench/gpu/trace_classify.py DIR [--out bench/results/FILE.json]

DIR holds ``trace_decode.json`` and the ``*.pt.trace.json.gz`` files. Per trace: the kernel time
classified (coverage), the split's mean step (classes + idle) against the mean CUDA-event time of
the very steps the profiler recorded (each event pair brackets one ``ProfilerStep#N``), and the
untraced CUDA-event median (the profiler's own cost on the step), the classes, the unmatched.
Runs where ceiling is installed (pydantic); the device image only records.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from ceiling.trace import read_trace, split  # the checkout's ceiling first


def classify(folder: Path) -> dict:
    meta = json.loads((folder / "trace_decode.json").read_text())
    rows = []
    for row in meta["rows"]:
        if "error" in row:
            rows.append(row)
            continue
        path = folder / row["trace_file"]
        sp = split([read_trace(path)], "generic")
        traced = statistics.fmean(row["event_ms_traced"])
        rows.append(
            {
                "name": row["name"],
                "trace_file": row["trace_file"],
                "steps": sp.steps,
                "step_source": sp.step_source,
                "coverage": sp.coverage,
                "split_step_ms": round(sp.step_ms, 4),
                "busy_ms": round(sp.busy_ms, 4),
                "idle_ms": round(sp.idle_ms, 4),
                "event_ms_traced_mean": round(traced, 4),
                "split_vs_event_pct": round((sp.step_ms - traced) / traced * 100, 2),
                "event_ms_untraced_median": round(row["event_ms_untraced_median"], 4),
                "profiler_cost_pct": round(
                    (traced - row["event_ms_untraced_median"])
                    / row["event_ms_untraced_median"]
                    * 100,
                    1,
                ),
                "classes": {c.op_class: round(c.ms, 4) for c in sp.classes},
                "unmatched": [(u.name[:100], round(u.ms, 4)) for u in sp.unmatched[:8]],
                "allreduce_ms": sp.class_ms("allreduce"),
            }
        )
    return {"schema_version": 1, "source": meta, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    res = classify(args.folder)
    for r in res["rows"]:
        if "error" in r:
            print(f"{r['name']}: {r['error']}")
            continue
        print(
            f"{r['name']:26s} steps {r['steps']} coverage {r['coverage'] * 100:6.2f} % | "
            f"classes+idle {r['split_step_ms']:8.3f} ms vs events {r['event_ms_traced_mean']:8.3f}"
            f" ms ({r['split_vs_event_pct']:+.2f} %) | idle {r['idle_ms']:.3f} ms | untraced "
            f"{r['event_ms_untraced_median']:.3f} ms (profiler +{r['profiler_cost_pct']} %)"
        )
        print("    " + ", ".join(f"{k} {v:.3f}" for k, v in r["classes"].items()))
        if r["unmatched"]:
            print("    unmatched: " + "; ".join(f"{n} {ms:.3f}" for n, ms in r["unmatched"]))
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
