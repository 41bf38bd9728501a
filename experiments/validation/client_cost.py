"""Where the client's time goes: CPU per chunk and per request, loop lag, and a profile.

Drives S streams of ``--tokens`` chunks (the synthetic server of ``synthetic_sse.py`` in its
own process, stamping every chunk) through the same code ``ceiling bench`` runs
(:func:`ceiling.bench.load.drive`), in this process, and reports:

- client CPU (user + system of this process) per chunk, for the whole share;
- the event loop's lag (a callback's wait, sampled every 5 ms) during the share;
- the chunk stamp error against the server's emission stamp (p50 / p99) and the TPOT error;
- with ``--profile``, cProfile's top functions by own CPU time (``time.process_time``).

Both timestamp paths can be measured: ``kernel`` (receive timestamps read with ``recvmsg``,
the default on Linux) and ``socket`` (the event loop's read time in ``data_received``).

Usage: .venv/bin/python experiments/validation/client_cost.py [--streams 256,1024] [--paths kernel,socket]
       [--profile] [--save FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standins"))
from synthetic_sse import SyntheticServer

from ceiling.bench import pool as bench_pool
from ceiling.bench.client import Client
from ceiling.bench.load import LoadState, RequestOptions, Share, drive
from ceiling.bench.looplag import LoopLagMonitor
from ceiling.bench.workloads import Prompt


async def _share(url: str, n: int, tokens: int, prof: cProfile.Profile | None) -> dict[str, Any]:
    async with Client(url, timeout_s=600) as client:
        state = LoadState(client)
        opts = RequestOptions(model="synthetic", path="/v1/completions", max_tokens=tokens)
        prompts = [Prompt(text=f"p {i}") for i in range(n)]
        share = Share(streams=n, count=n, prompts=prompts, options=opts)
        lag = LoopLagMonitor()
        lag.start()
        c0 = time.process_time()
        if prof:
            prof.enable()
        out = await drive(share, state)
        if prof:
            prof.disable()
        cpu = time.process_time() - c0
        lag_ms = await lag.stop()
        return {"sent": out.sent, "cpu_s": cpu, "lag_ms": lag_ms, "source": client.timestamp_source}


def measure(url: str, n: int, tokens: int, profile: bool) -> dict[str, Any]:
    runner_factory = None
    with contextlib.suppress(ImportError):
        import uvloop

        runner_factory = uvloop.new_event_loop
    prof = cProfile.Profile(time.process_time) if profile else None
    with asyncio.Runner(loop_factory=runner_factory) as runner:
        runner.run(_share(url, 4, tokens, None))  # warm-up
        res = runner.run(_share(url, n, tokens, prof))
    errs, tpot_err = [], []
    for sent in res["sent"]:
        emits, stamps = [], []
        for t, payload in sent.raw.events:
            if payload[:1] == b"{" and b'"t_emit_ns"' in payload:
                obj = json.loads(payload)
                if obj.get("choices"):
                    emits.append(obj["t_emit_ns"])
                    stamps.append(t)
        errs += [(s - e) / 1e6 for s, e in zip(stamps, emits, strict=True)]
        if len(emits) > 1:
            true = emits[-1] - emits[0]
            tpot_err.append(((stamps[-1] - stamps[0]) - true) / true * 100)
    chunks = len(errs)
    row = {
        "streams": n,
        "timestamp_source": res["source"],
        "chunks": chunks,
        "cpu_us_per_chunk": res["cpu_s"] / chunks * 1e6 if chunks else None,
        "cpu_us_per_request": res["cpu_s"] / n * 1e6,
        "loop_lag_ms": res["lag_ms"],
        "stamp_err_p50_ms": float(np.percentile(errs, 50)) if errs else None,
        "stamp_err_p99_ms": float(np.percentile(errs, 99)) if errs else None,
        "tpot_err_pct_mean": float(np.mean(tpot_err)) if tpot_err else None,
        "tpot_abs_err_pct_mean": float(np.mean(np.abs(tpot_err))) if tpot_err else None,
    }
    if prof is not None:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
        row["profile_top"] = buf.getvalue()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--streams", default="256,1024")
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--paths", default="kernel,socket")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--save", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    real_supported = bench_pool.kernel_stamps_supported
    with SyntheticServer(0.05, 0.01, stamp=True) as srv:
        for path in args.paths.split(","):
            bench_pool.kernel_stamps_supported = (
                real_supported if path == "kernel" else (lambda: False)
            )
            for n in [int(x) for x in args.streams.split(",")]:
                row = measure(srv.url, n, args.tokens, args.profile)
                row["load_avg_1m"] = os.getloadavg()[0]
                rows.append(row)
                print(
                    f"{row['timestamp_source']:>6} {n:5d} streams: CPU {row['cpu_us_per_chunk']:.1f}"
                    f" us/chunk, {row['cpu_us_per_request']:.0f} us/request; loop lag p99 "
                    f"{row['loop_lag_ms']['p99']:.2f} ms; stamp error p50 "
                    f"{row['stamp_err_p50_ms']:.3f} p99 {row['stamp_err_p99_ms']:.2f} ms; "
                    f"TPOT error {row['tpot_err_pct_mean']:+.3f} % (load {row['load_avg_1m']:.1f})",
                    flush=True,
                )
                if args.profile:
                    print(row["profile_top"])
    bench_pool.kernel_stamps_supported = real_supported
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps({"machine": os.uname().nodename, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
