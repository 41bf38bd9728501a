"""The capacity search at full length against the stand-in server with a known service rate.

Prints, for issue 41's goals: the knee found against the true knee (%), the goodput the bench
reported against an exact recount (%), and the search's wall time. Not a test: figures.

The server (tests/sse_server.py) serves SLOTS requests at once and queues the rest in arrival
order; a request of TOKENS tokens takes S = TTFT + (TOKENS - 1) x ITL, so it completes at most
SLOTS / S requests per second. The true knee is that of the queueing model (SLOTS slots,
deterministic service S, FIFO) fed the very arrivals the bench sends at each rate (same seed,
same generator, the full-length level rule), judged by the search's own pass rule: the highest
rate the model passes, by a fine bisection. The search runs at its defaults (200 requests or
30 s a level, 5 % tolerance, 2 % precision), starting at --rate START (the search doubles from
there: starting at 1 req/s would spend 200 s on the first level alone).

Goodput: each level's good_completed (the bench's figure) against a recount of its saved
per-request records (completed, TTFT at or under the SLO): how exactly goodput is counted.

    PYTHONPATH=src:tests .venv/bin/python bench/capacity_knee.py [--start 8]
"""

from __future__ import annotations

import argparse
import heapq
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src")]

from ceiling.bench.capacity import (  # noqa: E402
    DEFAULT_LEVEL_REQUESTS,
    DEFAULT_LEVEL_SECONDS,
    DEFAULT_TOLERANCE,
    level_requests,
)
from ceiling.bench.results import load_result  # noqa: E402
from ceiling.bench.workloads import arrival_offsets  # noqa: E402

SLOTS, TTFT_S, ITL_S, TOKENS = 8, 0.05, 0.05, 5
SERVICE_S = TTFT_S + (TOKENS - 1) * ITL_S  # 250 ms a request: 32 req/s at most
TTFT_SLO_MS = 300.0  # a request may wait about one service time in the queue
SEED = 0


def model_passes(rate: float) -> bool:
    """The level at ``rate`` on the queueing model, fed the arrivals the bench sends."""
    n = level_requests(rate, DEFAULT_LEVEL_REQUESTS, DEFAULT_LEVEL_SECONDS)
    sends = arrival_offsets(n, rate, 1.0, np.random.default_rng(SEED))
    free = [0.0] * SLOTS
    good = 0
    for t in sends:
        start = max(t, heapq.heappop(free))
        heapq.heappush(free, start + SERVICE_S)
        good += (start - t + TTFT_S) * 1000.0 <= TTFT_SLO_MS
    return good >= (1.0 - DEFAULT_TOLERANCE) * n


def true_knee() -> float:
    lo, hi = 1.0, 10.0 * SLOTS / SERVICE_S
    while hi / lo > 1.0005:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if model_passes(mid) else (lo, mid)
    return lo


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start", type=float, default=8.0, help="the search's first rate, req/s")
    args = ap.parse_args()
    server = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "sse_server.py"),
            "--slots",
            str(SLOTS),
            "--ttft",
            str(TTFT_S),
            "--itl",
            str(ITL_S),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = server.stdout.readline() if server.stdout else ""
        if not line.startswith("READY "):
            print(f"the stand-in server did not start: {line!r}")
            return 1
        url = line.split()[1]
        out = Path(tempfile.mkdtemp()) / "capacity.json"
        cmd = [
            sys.executable,
            "-m",
            "ceiling",
            "bench",
            "--url",
            url,
            "--mode",
            "capacity",
            "--slo",
            f"ttft:p99<={TTFT_SLO_MS:g}ms",
            "--rate",
            f"{args.start:g}",
            "--max-tokens",
            str(TOKENS),
            "--input-len",
            "4",
            "--seed",
            str(SEED),
            "--save-detailed",
            "--quiet",
            "--json",
            "--out",
            str(out),
        ]
        t0 = time.monotonic()
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        )
        wall = time.monotonic() - t0
    finally:
        server.terminate()
        server.wait(10)
    if proc.returncode != 0:
        print(proc.stderr[-2000:])
        return 1
    res = load_result(out)
    cap = res.capacity
    assert cap is not None
    knee = true_knee()
    print(
        f"stand-in: {SLOTS} slots, {SERVICE_S * 1000:.0f} ms a request "
        f"(service rate {SLOTS / SERVICE_S:.1f} req/s), SLO ttft:p99<={TTFT_SLO_MS:g}ms"
    )
    print(f"levels: {len(cap.curve)}; {cap.level_rule}; stopped: {cap.stopped}")
    for p in cap.curve:
        print(
            f"  {p.rate:8.3f} req/s  sent {p.sent:5d}  good {p.good_completed:5d}  "
            f"{'pass' if p.passed else 'FAIL'}"
        )
    found = cap.knee_rate or 0.0
    print(
        f"knee found {found:.3f} req/s, true knee {knee:.3f} req/s: "
        f"{(found / knee - 1) * 100:+.2f} % (goal: within 5 %)"
    )
    worst = 0.0
    for lv in res.levels:
        recs = lv.requests or []
        exact = sum(1 for r in recs if r.ok and r.ttft_ms is not None and r.ttft_ms <= TTFT_SLO_MS)
        if recs and exact:
            worst = max(worst, abs((lv.good_completed or 0) / exact - 1) * 100)
    print(f"goodput vs exact recount, worst level: {worst:.3f} % (goal: within 1 %)")
    print(f"wall time of the search: {wall:.0f} s (goal: under 600 s)")
    print(json.dumps({"knee": found, "true_knee": knee, "goodput_err_pct": worst, "wall_s": wall}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
