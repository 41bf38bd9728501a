"""Traced decode steps of tp_decode.py (issue 23 at TP=1, issues 28 and 29), read by ceiling.trace.

    python experiments/gpu/trace_report.py SESSION_DIR [--commbench commbench.json] [--json OUT]

SESSION_DIR holds what ``tp_decode.py --trace DIR`` wrote (searched recursively: each
configuration's ``config.json`` with ``<mode>/rank<R>.pt.trace.json.gz`` and
``<mode>/steps_rank<R>.json``), and, when the session ran them, ``commbench.json`` and the
``tp_decode_*.json`` results (their rows name their trace folder: ``trace_dir``). Per
configuration and mode (graph / eager) it prints: per-class ms per rank; the allreduce and
all-gather classes (calls per step against the step's count, ms against commbench's latency at
the step's message size x count); each collective's transfer apart from the wait for the
slowest rank; classes + idle (the trace's step) against the step timed on the ranks' own clock
(CUDA events; perf_counter on a CPU), and that clock's step against the untraced median (what
the profiler costs the step); then the goals of issue 23 (TP=1), 28 (TP=2) and 29 (TP>=4), each
met / not met / not measured here, with the figure that decides it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
sys.path.insert(0, str(SRC))

SCHEMA_VERSION = 1
# the issues' goals (issue 28: TP=2; issue 29: TP 4/8)
COVERAGE_GOAL = 0.95
COLLECTIVE_GOAL_PCT = 5.0
STEP_GOAL_PCT = 5.0
PREDICT_GOAL_PCT = {"tp": 10.0, "ep": 15.0}


def commbench_us(doc: dict | None, world: int, variant: str, size: int, graph: bool):
    """commbench's allreduce latency (us) at ``size`` bytes for this world size and variant,
    log-log interpolated between its measured sizes; (us, how) or (None, why not)."""
    if not doc or not doc.get("runs"):
        return None, "no commbench.json"
    runs = [
        r
        for r in doc.get("runs", [])
        if r.get("world_size") == world and r.get("variant") == variant and not r.get("error")
    ]
    if not runs:
        return None, f"commbench has no {variant} run at world size {world}"
    key = "graph_time_us" if graph else "time_us"
    pts = sorted(
        (r["size_bytes"], r[key]) for r in runs[0]["rows"] if r.get(key) and r.get("correct", 1)
    )
    if not pts:
        return None, f"commbench's {variant} run has no {key}"
    for (s0, t0), (s1, t1) in itertools.pairwise(pts):
        if s0 <= size <= s1:
            if s0 == s1 or size == s0:
                return t0, f"{key} at {s0} B"
            f = math.log(size / s0) / math.log(s1 / s0)
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0))), (
                f"{key} between {s0} and {s1} B"
            )
    return None, f"{size} B is outside commbench's sizes {pts[0][0]}..{pts[-1][0]} B"


def _pct(a: float, b: float) -> float:
    return 100.0 * (a - b) / b if b else math.inf


def analyse_mode(cfg: dict, mode_dir: Path, commbench: dict | None, row: dict | None) -> dict:
    from ceiling.trace import read_trace, split

    files = sorted(mode_dir.glob("rank*.pt.trace.json.gz"))
    traces = [read_trace(p) for p in files]
    whole = split(traces)
    clocks = {}
    for p in sorted(mode_dir.glob("steps_rank*.json")):
        d = json.loads(p.read_text())
        clocks[d["rank"]] = d
    graph = mode_dir.name == "graph"
    ranks = []
    for t, rs in zip(traces, sorted(whole.ranks, key=lambda r: r.rank or 0), strict=False):
        alone = split([t])  # this rank's own coverage and calls per step
        clock = clocks.get(rs.rank)
        ev = statistics.fmean(clock["steps_ms"]) if clock else None
        calls = {c.op_class: c.calls for c in alone.classes}
        ranks.append(
            {
                "rank": rs.rank,
                "steps": rs.steps,
                "classes_ms": rs.classes,
                "idle_ms": rs.idle_ms,
                "trace_step_ms": rs.step_ms,
                "classes_plus_idle_ms": round(sum(rs.classes.values()) + rs.idle_ms, 6),
                "clock": clock["clock"] if clock else None,
                "clock_step_ms": ev,
                "clock_steps": len(clock["steps_ms"]) if clock else 0,
                "step_vs_clock_pct": None if ev is None else round(_pct(rs.step_ms, ev), 3),
                "coverage": alone.coverage,
                "calls_per_step": calls,
                "collective_wait_ms": rs.collective_wait_ms,
            }
        )
    world = int(cfg["tp"])
    colls = []
    for op, key in (("allreduce", "allreduces_per_step"), ("allgather", "allgathers_per_step")):
        want = cfg.get(key)
        ms = whole.class_ms(op)
        ct = next((c for c in whole.classes if c.op_class == op), None)
        us = how = None
        expected = None
        if op == "allreduce" and want:
            us, how = commbench_us(
                commbench, world, cfg.get("variant", "default"), int(cfg["allreduce_bytes"]), graph
            )
            expected = None if us is None else us * want / 1e3
        colls.append(
            {
                "op_class": op,
                "count_expected": want,
                "calls_per_step": {r["rank"]: r["calls_per_step"].get(op, 0) for r in ranks},
                "ms": ms,
                "transfer_ms": ct.transfer_ms if ct else None,
                "wait_ms": ct.wait_ms if ct else None,
                "commbench_us": us,
                "commbench_how": how,
                "commbench_x_count_ms": expected,
                "vs_commbench_pct": None if expected is None else round(_pct(ms, expected), 2),
            }
        )
    waits = [w.model_dump() for w in whole.collective_waits]
    out = {
        "mode": mode_dir.name,
        "path": str(mode_dir),
        "files": [p.name for p in files],
        "world_size": world,
        "ranks_present": [r["rank"] for r in ranks],
        "missing_ranks": whole.missing_ranks,
        "slowest_rank": whole.slowest_rank,
        "rank_spread_pct": whole.rank_spread_pct,
        "step_ms": whole.step_ms,
        "headline": whole.headline,
        "ranks": ranks,
        "collectives": colls,
        "collective_waits": waits,
        "notes": whole.notes,
    }
    # the same configuration untimed by the profiler (config.json holds its median): the traced
    # steps are compared with each other, never with an untraced bench
    untraced = cfg.get(f"{mode_dir.name}_ms")
    clock_ms = [r["clock_step_ms"] for r in ranks if r["clock_step_ms"] is not None]
    out["untraced_ms"] = untraced
    out["profiler_cost_pct"] = (
        round(_pct(max(clock_ms), untraced), 1) if untraced and clock_ms else None
    )
    if row and graph:
        out["measured_graph_ms"] = row.get("graph_ms")
        out["predicted_graph_ms"] = row.get("predicted_graph_ms")
    out["goals"] = goals(cfg, out)
    return out


def goals(cfg: dict, m: dict) -> list[dict]:
    """The issues' goals for one traced configuration: met / not met / not measured."""

    def goal(issue, what, ok, figure):
        state = "not measured" if ok is None else ("met" if ok else "not met")
        return {"issue": issue, "goal": what, "state": state, "figure": figure}

    tp, out = int(cfg["tp"]), []
    # issue 23: one GPU's trace classified and adding up; 28: the same on two ranks; 29: TP >= 4
    issue = {1: 23, 2: 28}.get(tp, 29)
    all_present = not m["missing_ranks"] and len(m["ranks"]) == tp
    where = "the one rank" if tp == 1 else "both ranks"
    if issue in (23, 28):
        cov = [r["coverage"] for r in m["ranks"]]
        out.append(
            goal(
                issue,
                f">= {COVERAGE_GOAL:.0%} of kernel time classified on {where}",
                all_present and min(cov) >= COVERAGE_GOAL if cov else None,
                ", ".join(f"rank {r['rank']} {r['coverage']:.1%}" for r in m["ranks"]),
            )
        )
    for c in m["collectives"]:
        if c["op_class"] != "allreduce" or not c["count_expected"]:
            continue
        v = c["vs_commbench_pct"]
        out.append(
            goal(
                issue,
                f"allreduce class within {COLLECTIVE_GOAL_PCT:g} % of commbench x count",
                None if v is None else abs(v) <= COLLECTIVE_GOAL_PCT,
                c["commbench_how"]
                if v is None
                else f"{c['ms']:.4f} ms vs {c['commbench_x_count_ms']:.4f} ms ({v:+.1f} %)",
            )
        )
    if issue in (23, 28):
        d = [r["step_vs_clock_pct"] for r in m["ranks"]]
        out.append(
            goal(
                issue,
                f"classes + idle within {STEP_GOAL_PCT:g} % of the step timed with CUDA events",
                None if not d or None in d else all(abs(x) <= STEP_GOAL_PCT for x in d),
                ", ".join(
                    f"rank {r['rank']} {r['classes_plus_idle_ms']:.4f} vs "
                    f"{r['clock_step_ms'] or 0:.4f} ms ({r['clock']})"
                    for r in m["ranks"]
                ),
            )
        )
    else:
        out.append(
            goal(
                29,
                "skew reported",
                bool(m["collective_waits"]) if all_present else False,
                f"rank spread {m['rank_spread_pct']} %, slowest rank {m['slowest_rank']}",
            )
        )
        if m["mode"] == "graph":
            lim = PREDICT_GOAL_PCT.get(cfg.get("parallel", "tp"), 10.0)
            g, p = m.get("measured_graph_ms"), m.get("predicted_graph_ms")
            out.append(
                goal(
                    29,
                    f"graph row within {lim:g} % of predict (median within 5 % is over all rows)",
                    None if not g or not p else abs(_pct(p, g)) <= lim,
                    "no predicted_graph_ms in the tp_decode row"
                    if not g or not p
                    else f"predicted {p:.3f} vs measured {g:.3f} ms ({_pct(p, g):+.1f} %)",
                )
            )
    return out


def analyse(root: Path, commbench_path: Path | None = None) -> dict:
    # every commbench result of the session (one per world-size group), runs pooled: each
    # configuration looks up its own world size and variant
    paths = [commbench_path] if commbench_path else sorted(root.rglob("commbench*.json"))
    commbench = {"runs": [r for p in paths for r in json.loads(p.read_text()).get("runs", [])]}
    rows = {}
    for p in sorted(root.rglob("tp_*.json")):  # tp_decode's results (tp_trace_*.json too)
        try:
            for r in json.loads(p.read_text()).get("rows", []):
                if r.get("trace_dir"):
                    rows[r["trace_dir"]] = r
        except (ValueError, AttributeError):
            continue
    configs = []
    for cp in sorted(root.rglob("config.json")):
        cfg = json.loads(cp.read_text())
        if "tp" not in cfg or "allreduces_per_step" not in cfg:
            continue  # not a tp_decode trace folder
        entry = {"config": cp.parent.name, **{k: cfg.get(k) for k in _KEYS}, "modes": []}
        for mode in cfg.get("trace_modes") or []:
            md = cp.parent / mode
            if not md.is_dir() or not list(md.glob("rank*.pt.trace.json.gz")):
                entry["modes"].append({"mode": mode, "error": f"no traces under {md}"})
                continue
            try:
                entry["modes"].append(analyse_mode(cfg, md, commbench, rows.get(cp.parent.name)))
            except Exception as exc:  # one unreadable configuration does not hide the rest
                entry["modes"].append({"mode": mode, "error": f"{type(exc).__name__}: {exc}"})
        configs.append(entry)
    return {
        "schema_version": SCHEMA_VERSION,
        "root": str(root),
        "commbench": ", ".join(str(p) for p in paths) or None,
        "configs": configs,
    }


_KEYS = ("model", "tp", "parallel", "variant", "batch", "context", "layers", "device_name")


def _f(x, nd=4):
    return "-" if x is None else f"{x:.{nd}f}"


def render(doc: dict) -> str:
    out = [f"# Traced TP decode steps ({doc['root']})", ""]
    out.append(f"commbench: {doc['commbench'] or 'none (the allreduce class is not compared)'}")
    for c in doc["configs"]:
        for m in c["modes"]:
            b = c.get("batch")  # batches side by side under one root stay apart in the headings
            title = f"{c['model']} TP={c['tp']} {c['parallel']} {c['variant']}" + (
                f" batch {b}" if b not in (None, 1) else ""
            )
            title += f", {m['mode']}"
            out += ["", f"## {title}", ""]
            if "error" in m:
                out.append(f"error: {m['error']}")
                continue
            out.append(m["headline"])
            classes = sorted({k for r in m["ranks"] for k in r["classes_ms"]})
            out += [
                "",
                "| class | " + " | ".join(f"rank {r['rank']} ms" for r in m["ranks"]) + " |",
                "|---|" + "---|" * len(m["ranks"]),
            ]
            for k in classes:
                cells = " | ".join(_f(r["classes_ms"].get(k)) for r in m["ranks"])
                out.append(f"| {k} | {cells} |")
            out.append("| idle | " + " | ".join(_f(r["idle_ms"]) for r in m["ranks"]) + " |")
            out.append(
                "| **classes + idle** | "
                + " | ".join(_f(r["classes_plus_idle_ms"]) for r in m["ranks"])
                + " |"
            )
            out.append(
                "| step on the ranks' clock | "
                + " | ".join(
                    f"{_f(r['clock_step_ms'])} ({r['clock']}, {_pct_s(r['step_vs_clock_pct'])})"
                    for r in m["ranks"]
                )
                + " |"
            )
            out.append(
                "| coverage | " + " | ".join(f"{r['coverage']:.1%}" for r in m["ranks"]) + " |"
            )
            if m.get("profiler_cost_pct") is not None:
                out.append(
                    f"\nuntraced median {m['untraced_ms']:.4f} ms: the profiler costs the step "
                    f"{m['profiler_cost_pct']:+.1f} % (compare traced steps with each other)"
                )
            out += ["", "| collective | calls/step per rank | expected | ms | transfer ms | "
                    "wait ms | commbench x count ms | vs commbench |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
            for k in m["collectives"]:
                calls = ", ".join(f"{v:g}" for v in k["calls_per_step"].values())
                out.append(
                    f"| {k['op_class']} | {calls} | {k['count_expected']} | {_f(k['ms'])} | "
                    f"{_f(k['transfer_ms'])} | {_f(k['wait_ms'])} | "
                    f"{_f(k['commbench_x_count_ms'])} | {_pct_s(k['vs_commbench_pct'])} |"
                )
            for w in m["collective_waits"]:
                out.append(
                    f"\n{w['op_class']}: transfer {w['transfer_ms']:.4f} ms/step; waiting for the "
                    f"slowest rank {w['wait_ms_mean']:.4f} ms mean, {w['wait_ms_max']:.4f} ms on "
                    f"rank {w['most_waiting_rank']}"
                )
            out += ["", "| issue | goal | state | figure |", "|---|---|---|---|"]
            for g in m["goals"]:
                out.append(f"| {g['issue']} | {g['goal']} | **{g['state']}** | {g['figure']} |")
    return "\n".join(out)


def _pct_s(v) -> str:
    return "-" if v is None else f"{v:+.2f} %"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="the session's result folder (or a --trace DIR)")
    ap.add_argument(
        "--commbench", type=Path, default=None, help="default: every ROOT/**/commbench*.json"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    if not args.root.is_dir():
        print(f"error: {args.root} is not a folder", file=sys.stderr)
        print("fix: pass the session's result folder (tp_decode.py --trace DIR)", file=sys.stderr)
        return 2
    doc = analyse(args.root, args.commbench)
    if not doc["configs"]:
        print(f"error: no traced configuration (config.json) under {args.root}", file=sys.stderr)
        print("fix: run experiments/gpu/tp_decode.py --trace DIR, then pass DIR", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
