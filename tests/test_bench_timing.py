"""Timing accuracy: the client's chunk timestamps against the server's emission stamps.

The server runs in its own process and stamps each chunk with CLOCK_MONOTONIC just before the
write; the client's timestamps use the same clock. The tolerances are loose (a shared 2-core
box); ``experiments/validation/client_fidelity.py`` measures the real figures.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from box_noise import RERUN_WHEN_SWAMPED, BoxTooNoisy, RunQueueWait
from ceiling.bench.client import Client
from ceiling.bench.metrics import process

SERVER = Path(__file__).parent / "sse_server.py"


@pytest.fixture
def server():
    """(url, pid) of the synthetic server in a process of its own."""
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--ttft", "0.02", "--itl", "0.01"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("READY "), line
        yield line.split()[1], proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


async def _streams(url: str, n: int, tokens: int, source: str):
    body = json.dumps(
        {"model": "synthetic", "prompt": "a b c", "max_tokens": tokens, "stream": True}
    ).encode()
    async with Client(url, timeout_s=60) as client:
        assert client.timestamp_source == source
        return await asyncio.gather(*(client.stream("/v1/completions", body) for _ in range(n)))


def _measure(url: str, source: str) -> tuple[list[float], list[float], list[float]]:
    """(per-chunk error ms, per-request relative TPOT error, server TPOT ms) of one try."""
    raws = asyncio.run(_streams(url, 4, 40, source))
    errors_ms, tpot_err, true_tpots = [], [], []
    for i, raw in enumerate(raws):
        rec = process(raw, i, max_tokens=40)
        assert rec.ok and rec.output_tokens == 40
        emits = []
        for t, payload in raw.events:
            if payload.startswith(b"{"):
                obj = json.loads(payload)
                if obj.get("choices") and obj["choices"][0].get("text"):
                    emits.append(obj["t_emit_ns"])
                    errors_ms.append((t - obj["t_emit_ns"]) / 1e6)
        assert len(emits) == 40
        true_tpot = (emits[-1] - emits[0]) / 1e6 / 39
        true_tpots.append(true_tpot)
        tpot_err.append(abs(rec.tpot_ms - true_tpot) / true_tpot)
    return errors_ms, tpot_err, true_tpots


#: The TPOT bound, and the stream's span it applies to (39 intervals of the server's 10 ms).
TPOT_TOLERANCE, SPAN_MS = 0.03, 39 * 10.0


@RERUN_WHEN_SWAMPED
@pytest.mark.timeout(120)
@pytest.mark.parametrize("source", ["kernel", "socket"])
def test_chunk_timestamps_and_tpot_track_emission(
    server: tuple[str, int], source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Up to three tries; a try that misses a bound is tried again only when the box says it
    got in the way of that try: the server missed its own schedule, or the box kept the client
    or the server waiting for a CPU (run-queue wait) at least as long as the TPOT bound allows
    over a stream (3 % of 390 ms). A miss on a box that kept both on time fails at once, and so
    does a stamp before the write in any try; three swamped tries are BoxTooNoisy (rerun once)."""
    url, server_pid = server
    if source == "socket":  # the path TLS and non-Linux platforms take
        monkeypatch.setattr("ceiling.bench.pool.kernel_stamps_supported", lambda: False)
    allowed_ms = TPOT_TOLERANCE * SPAN_MS
    swamped = []
    for _attempt in range(3):
        before = RunQueueWait.now(os.getpid(), server_pid)
        errors_ms, tpot_err, true_tpots = _measure(url, source)
        waited = RunQueueWait.now(os.getpid(), server_pid).ms_since(before)
        # Never before the server wrote it: same clock, stamps taken on arrival (the kernel's
        # are moved from CLOCK_REALTIME to the monotonic clock: allow that a few us).
        assert min(errors_ms) >= -0.02
        median = float(np.percentile(errors_ms, 50))
        figures = (
            f"median chunk error {median:.2f} ms, worst TPOT error {max(tpot_err):.1%}; "
            f"server TPOT {min(true_tpots):.2f}-{max(true_tpots):.2f} ms; run-queue wait: "
            f"client {waited[os.getpid()]:.1f} ms, server {waited[server_pid]:.1f} ms"
        )
        if not all(t == pytest.approx(10.0, rel=0.2) for t in true_tpots):
            swamped.append(figures)  # the server itself missed its schedule: no verdict
            continue
        if median < 2.0 and max(tpot_err) < TPOT_TOLERANCE:
            return
        if max(waited.values()) < allowed_ms:
            pytest.fail(f"{figures} (the box kept both on time: < {allowed_ms:.1f} ms waiting)")
        swamped.append(figures)
    raise BoxTooNoisy("; ".join(swamped))
