"""Timing accuracy: the client's chunk timestamps against the server's emission stamps.

The server runs in its own process and stamps each chunk with CLOCK_MONOTONIC just before the
write; the client's timestamps use the same clock. The tolerances are loose (a shared 2-core
box); ``bench/validation/client_fidelity.py`` measures the real figures.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ceiling.bench.client import Client
from ceiling.bench.metrics import process

SERVER = Path(__file__).parent / "sse_server.py"


@pytest.fixture
def server_url():
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--ttft", "0.02", "--itl", "0.01"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("READY "), line
        yield line.split()[1]
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


@pytest.mark.timeout(120)
@pytest.mark.parametrize("source", ["kernel", "socket"])
def test_chunk_timestamps_and_tpot_track_emission(
    server_url: str, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if source == "socket":  # the path TLS and non-Linux platforms take
        monkeypatch.setattr("ceiling.bench.pool.kernel_stamps_supported", lambda: False)
    # Up to three tries: a shared 2-core box stalls processes now and then, which is noise, not
    # the client. A client that stamps late or lumps chunks together fails every try.
    for _attempt in range(3):
        errors_ms, tpot_err, true_tpots = _measure(server_url, source)
        # Never before the server wrote it: same clock, stamps taken on arrival (the kernel's
        # are moved from CLOCK_REALTIME to the monotonic clock: allow that a few us).
        assert min(errors_ms) >= -0.02
        if not all(t == pytest.approx(10.0, rel=0.2) for t in true_tpots):
            continue  # the server itself missed its schedule (a busy box): try again
        if float(np.percentile(errors_ms, 50)) < 2.0 and max(tpot_err) < 0.03:
            return
    pytest.fail(
        f"median chunk error {np.percentile(errors_ms, 50):.2f} ms, "
        f"worst TPOT error {max(tpot_err):.1%} in three tries"
    )
