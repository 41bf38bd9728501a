"""Timing accuracy: the client's chunk timestamps against the server's emission stamps.

The server runs in its own process and stamps each chunk with CLOCK_MONOTONIC just before the
write; the client's timestamps use the same clock. The tolerances are loose (a shared 2-core
box); ``bench/client_fidelity.py`` measures the real figures.
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


async def _streams(url: str, n: int, tokens: int):
    body = json.dumps(
        {"model": "synthetic", "prompt": "a b c", "max_tokens": tokens, "stream": True}
    ).encode()
    async with Client(url, timeout_s=60) as client:
        assert client.timestamp_source == "socket"
        return await asyncio.gather(*(client.stream("/v1/completions", body) for _ in range(n)))


@pytest.mark.timeout(60)
def test_chunk_timestamps_and_tpot_track_emission(server_url: str) -> None:
    raws = asyncio.run(_streams(server_url, 4, 40))
    errors_ms, tpot_err = [], []
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
        assert true_tpot == pytest.approx(10.0, rel=0.2)
        tpot_err.append(abs(rec.tpot_ms - true_tpot) / true_tpot)
    assert min(errors_ms) >= 0.0  # never before the server wrote it: same clock
    assert float(np.percentile(errors_ms, 50)) < 2.0
    assert max(tpot_err) < 0.03
