"""Chunk ingest rate: the most chunks/s a benchmark client time-stamps without falling behind.

One command, made for a machine with spare cores (e.g. a GPU host's CPUs), done in < 4 min,
JSON to --out::

    python3 experiments/validation/ingest_rate.py --out "$OUT/ingest_rate.json"

It needs ceiling's runtime dependencies only (aiohttp, uvloop, numpy, pydantic, rich, pyyaml,
typer): ceiling itself runs from this checkout's ``src/`` when it is not installed.

Method. The synthetic server (``synthetic_sse.py``) runs as several processes on one port, so
that it outpaces any client, and logs when it really sent each chunk. Each client is ramped:
S streams (S requests at concurrency S, ``--tokens`` tokens each, one every 10 ms after a
50 ms TTFT: S x 100 chunks/s offered), S = 256, 512, 724, 1024, ... (x sqrt 2 from 512 on,
up to 8192; ``--streams`` to change). A step *keeps up* when every request completed, the
client's mean TPOT is within 0.5 % of the server's truth (a client that falls behind stamps
the last chunks later than the first ones: TPOT grows), and
the share of a stream's inter-chunk gaps under 1 ms exceeds the server's own by less than 1 %
(chunks that piled up unread in a socket get one stamp, whatever the stamping method); a
step that does not is run once more (noise fails once, saturation twice). A client's
ingest rate is the highest chunk rate the server really sent (chunks / span, from its own
stamps) in a step that kept up; ``ingest_tpot_only_chunks_per_s`` applies the TPOT test alone
(a looser reading for a loaded machine); the ramp stops when even that fails.

Clients: ``ceiling bench --workers 1, 2, 4`` (4 only with 8+ cores), and ``vllm bench serve``
when this checkout has ``.engines/vllm``; where vLLM cannot be installed, ``--vllm-lib DIR``
adds ``vllm-fn``: vLLM's own request function driven as ``vllm bench serve`` drives it
(``vllm_request_client.py``). Without either the JSON says so and the ratios are against
ceiling's single process. The figures to read: ``ratios``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The sibling harness (client_vs_vllm) and the stand-in server (experiments/standins/).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standins"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from client_vs_vllm import (
    close_gap_share,
    machine,
    run_ceiling,
    run_vllm,
    scored,
    truth_of,
    vllm_available,
)
from synthetic_sse import SyntheticServer

ERR_LIMIT_PCT = 0.5
#: Gaps under 1 ms between a stream's chunks beyond the server's own: chunks piled up unread.
PILE_LIMIT = 0.01


def run_vllm_fn(lib: Path, url: str, n: int, tokens: int, timeout_s: float) -> dict[str, Any]:
    """vLLM's request function driven as ``vllm bench serve`` drives it
    (``vllm_request_client.py``), where vLLM itself is not installed."""
    script = Path(__file__).resolve().parents[1] / "standins" / "vllm_request_client.py"
    cmd = [sys.executable, str(script), "--lib", str(lib), "--url", url, "--n", str(n)]
    try:
        proc = subprocess.run(
            [*cmd, "--tokens", str(tokens)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"vLLM's request function took over {timeout_s:g} s"}
    if proc.returncode != 0:
        return {"error": f"vllm_request_client failed (rc {proc.returncode}): {proc.stderr[-600:]}"}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if "itls_ms" in out:
        out["close_gap_share"] = close_gap_share(out.pop("itls_ms"))
    return out


def _dataset(n: int) -> Path:
    """Fixed short prompts (no tokenizer round trips before each step)."""
    path = Path(tempfile.gettempdir()) / f"ingest-prompts-{os.getpid()}.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i} a b c d e f"}) + "\n" for i in range(n)))
    return path


def ramp(
    name: str,
    run: Any,
    srv: SyntheticServer,
    streams: list[int],
    tokens: int,
    deadline: float,
) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    best: float | None = None  # kept up: TPOT and piling
    best_tpot: float | None = None  # TPOT alone (a looser reading, for a loaded machine)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    for s in streams:
        if s + 256 > nofile:
            steps.append({"streams": s, "skipped": f"open-files limit {nofile}"})
            break
        ok = tpot_ok = False
        for attempt in (1, 2):  # a failed step runs once more: noise fails once, saturation twice
            left = deadline - time.monotonic()
            if left < 15:
                steps.append({"streams": s, "skipped": "time budget"})
                break
            srv.collect()
            res = run(srv.url, s, tokens, min(left, 120))
            truth = truth_of(srv.collect(), res.get("warmups", 1))
            row = scored(res, truth)
            row.pop("truth", None)
            rate = truth.get("chunk_rate_per_s")
            err = row.get("tpot_err_pct")
            piled = row.get("excess_close_gap_share")
            complete = row.get("failed") == 0 and row.get("completed") == s
            tpot_ok = complete and err is not None and abs(err) < ERR_LIMIT_PCT
            ok = tpot_ok and piled is not None and piled < PILE_LIMIT
            row.update(streams=s, attempt=attempt, offered_chunks_per_s=s * 100, kept_up=ok)
            row.update(tpot_within_limit=tpot_ok, server_chunks_per_s=rate)
            row["load_avg_1m"] = os.getloadavg()[0]
            steps.append(row)
            print(
                f"{name:>11} {s:5d} streams: sent {rate or 0:8.0f} chunks/s  TPOT error "
                + (f"{err:+.3f} %" if err is not None else f"- ({str(row.get('error'))[:200]})")
                + (f"  piled {piled:.2%}" if piled is not None else "")
                + ("  kept up" if ok else "  TPOT only" if tpot_ok else "  FELL BEHIND"),
                flush=True,
            )
            if ok:
                best = max(best or 0.0, rate or 0.0)
            if tpot_ok:
                best_tpot = max(best_tpot or 0.0, rate or 0.0)
            if ok:
                break
        if not tpot_ok:
            break
    return {"ingest_chunks_per_s": best, "ingest_tpot_only_chunks_per_s": best_tpot, "steps": steps}


def _ratios(rates: dict[str, float | None], base_name: str) -> dict[str, float | None]:
    base = rates.get(base_name)
    return {
        f"{k}/{base_name}": (v / base if v and base else None)
        for k, v in rates.items()
        if k != base_name
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--streams", default="256,512,724,1024,1448,2048,2896,4096,5792,8192")
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--budget", type=float, default=215.0, help="seconds for the whole run")
    ap.add_argument("--server-procs", type=int, default=0, help="0: half the cores")
    ap.add_argument("--workers", default="", help="ceiling --workers values (default 1,2[,4])")
    ap.add_argument("--clients", default="", help="only these (e.g. vllm,ceiling-w2)")
    ap.add_argument(
        "--vllm-lib",
        type=Path,
        default=None,
        help="without vLLM installed: a folder with vLLM's endpoint_request_func.py "
        "(bash experiments/gpu/gpu_wheels.sh --vllm-client); adds the client `vllm-fn`",
    )
    args = ap.parse_args()
    t_start = time.monotonic()
    cores = os.cpu_count() or 1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > 1 << 20:
        hard = 1 << 20
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, hard), max(soft, hard)))
    streams = [int(x) for x in args.streams.split(",")]
    workers = [int(x) for x in args.workers.split(",")] if args.workers else [1, 2]
    if not args.workers and cores >= 8:
        workers.append(4)
    procs = args.server_procs or max(1, cores // 2)
    dataset = _dataset(max(streams) + 8)
    clients: dict[str, Any] = {}
    why_not = vllm_available()
    if why_not is None:
        clients["vllm"] = lambda url, n, tok, left: run_vllm(url, n, tok, timeout_s=left)
    if args.vllm_lib is not None and (args.vllm_lib / "endpoint_request_func.py").exists():
        lib = args.vllm_lib.resolve()
        clients["vllm-fn"] = lambda url, n, tok, left: run_vllm_fn(lib, url, n, tok, left)
    for w in workers:
        clients[f"ceiling-w{w}"] = lambda url, n, tok, left, w=w: run_ceiling(
            url, n, tok, workers=w, timeout_s=left, dataset=dataset
        )
    if args.clients:
        keep = set(args.clients.split(","))
        clients = {k: v for k, v in clients.items() if k in keep}
    print(
        f"{machine()}: server {procs} processes, clients {', '.join(clients)}"
        + ("" if why_not is None else f" (vllm bench serve not available: {why_not})"),
        flush=True,
    )
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "cores": cores,
        "python": platform.python_version(),
        "nofile_limit": [soft, hard],
        "server_procs": procs,
        "tokens": args.tokens,
        "err_limit_pct": ERR_LIMIT_PCT,
        "vllm_bench_serve": why_not or "available",
        "clients": {},
    }
    try:
        with SyntheticServer(0.05, 0.01, procs=procs) as srv:
            names = list(clients)
            for i, name in enumerate(names):
                share = (t_start + args.budget - time.monotonic()) / (len(names) - i)
                deadline = time.monotonic() + share
                result["clients"][name] = ramp(
                    name, clients[name], srv, streams, args.tokens, deadline
                )
    finally:
        dataset.unlink(missing_ok=True)
    rates = {k: v["ingest_chunks_per_s"] for k, v in result["clients"].items()}
    loose = {k: v["ingest_tpot_only_chunks_per_s"] for k, v in result["clients"].items()}
    base_name = next((b for b in ("vllm", "vllm-fn") if b in rates), "ceiling-w1")
    result["ratios"] = _ratios(rates, base_name)
    result["ratios_tpot_only"] = _ratios(loose, base_name)
    result["ratios_basis"] = base_name
    result["wall_s"] = time.monotonic() - t_start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("\ningest rate, chunks/s kept up with (TPOT and piling | TPOT alone):")
    for k, v in rates.items():
        a = f"{v:,.0f}" if v else "none"
        b = f"{loose[k]:,.0f}" if loose[k] else "none"
        print(f"  {k:>11}: {a} | {b}")
    for (k, v), w in zip(
        result["ratios"].items(), result["ratios_tpot_only"].values(), strict=True
    ):
        print(f"  {k}: " + (f"{v:.2f}x" if v else "-") + " | " + (f"{w:.2f}x" if w else "-"))
    print(f"wrote {args.out} ({result['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
