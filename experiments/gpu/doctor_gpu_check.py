"""A doctor run on a real GPU without an inference engine: a decode-shaped load behind an
OpenAI-compatible streaming API, then `ceiling doctor --url` on it.

Why: the GPU path of the doctor (probe -> catalog GPU -> predict -> NVML telemetry timeline ->
attribution against real GPU work) cannot run on the CPU-only development box, and the GPU
machine has no vLLM. This server paces tokens with real work: every decode step reads the
weights of a Llama-3.1-8B-shaped model (bf16, 32 layers of qkv/o/gate-up/down GEMMs + lm_head,
~16 GB) once for all active streams (continuous batching), eagerly, without CUDA graphs. The
doctor is then asked about `llama-3.1-8b` on the probed GPU, so its floors (weights at the HBM
bandwidth) and its launch term can be set against a step whose cost we know is dominated by the
same weight reads.

    python3 experiments/gpu/doctor_gpu_check.py [OUT_DIR]     # needs torch + CUDA; PYTHONPATH=src

It serves on 127.0.0.1, runs the doctor in a subprocess and stops the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from aiohttp import web

HIDDEN, INTER, LAYERS, VOCAB, KV = 4096, 14336, 32, 128256, 1024  # Llama-3.1-8B shapes


class DecodeLoad:
    """Weights on the GPU and one eager decode step for a batch of B streams."""

    def __init__(self) -> None:
        dev, dt = "cuda", torch.bfloat16
        g = torch.Generator(device=dev).manual_seed(0)

        def w(o: int, i: int) -> torch.Tensor:
            return (torch.randn(o, i, device=dev, dtype=dt, generator=g) * 0.02).contiguous()

        self.layers = [
            (w(HIDDEN + 2 * KV, HIDDEN), w(HIDDEN, HIDDEN), w(2 * INTER, HIDDEN), w(HIDDEN, INTER))
            for _ in range(LAYERS)
        ]
        self.lm_head = w(VOCAB, HIDDEN)
        self.bytes = sum(t.numel() * 2 for layer in self.layers for t in layer)
        self.bytes += self.lm_head.numel() * 2

    @torch.inference_mode()
    def step(self, batch: int) -> None:
        x = torch.randn(batch, HIDDEN, device="cuda", dtype=torch.bfloat16)
        for qkv, o, gu, down in self.layers:
            h = x @ qkv.T
            x = x + h[:, :HIDDEN] @ o.T
            a = x @ gu.T
            x = x + (torch.nn.functional.silu(a[:, :INTER]) * a[:, INTER:]) @ down.T
        (x @ self.lm_head.T).argmax(-1)
        torch.cuda.synchronize()


class Server:
    """Continuous batching: one step yields one token for every active stream."""

    def __init__(self, load: DecodeLoad) -> None:
        self.load = load
        self.active: list[asyncio.Queue[int]] = []
        self.wake = asyncio.Event()

    async def engine(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.active:
                self.wake.clear()
                await self.wake.wait()
            streams = list(self.active)
            await loop.run_in_executor(None, self.load.step, len(streams))
            for q in streams:
                q.put_nowait(1)

    async def models(self, _r: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "llama-8b-shaped", "owned_by": "synthetic"}]})

    async def health(self, _r: web.Request) -> web.Response:
        return web.Response(text="")

    async def complete(self, req: web.Request) -> web.StreamResponse:
        body = await req.json()
        n = int(body.get("max_tokens") or 16)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        q: asyncio.Queue[int] = asyncio.Queue()
        self.active.append(q)
        self.wake.set()
        try:
            for i in range(n):
                await q.get()
                chunk = {
                    "id": "x",
                    "object": "text_completion",
                    "model": "llama-8b-shaped",
                    "choices": [
                        {
                            "index": 0,
                            "text": " a",
                            "finish_reason": "length" if i == n - 1 else None,
                        }
                    ],
                }
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            usage = {
                "id": "x",
                "choices": [],
                "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": n + 8},
            }
            await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        finally:
            self.active.remove(q)
        return resp


def serve(load: DecodeLoad, port: int, ready: threading.Event) -> None:
    async def main() -> None:
        srv = Server(load)
        app = web.Application()
        app.router.add_get("/v1/models", srv.models)
        app.router.add_get("/health", srv.health)
        app.router.add_post("/v1/completions", srv.complete)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        task = asyncio.create_task(srv.engine())
        ready.set()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "doctor-gpu"))
    out.mkdir(parents=True, exist_ok=True)
    load = DecodeLoad()
    for _ in range(3):
        load.step(1)
    t0 = time.perf_counter()
    for _ in range(20):
        load.step(1)
    step_ms = (time.perf_counter() - t0) / 20 * 1e3
    print(
        f"decode load: {load.bytes / 1e9:.2f} GB of bf16 weights, eager step at B=1: "
        f"{step_ms:.2f} ms ({load.bytes / step_ms / 1e6:.0f} GB/s effective)",
        flush=True,
    )
    port = 18123
    ready = threading.Event()
    threading.Thread(target=serve, args=(load, port, ready), daemon=True).start()
    ready.wait(30)
    cmd = [
        sys.executable,
        "-m",
        "ceiling",
        "doctor",
        "--url",
        f"http://127.0.0.1:{port}",
        "--model-path",
        "llama-3.1-8b",
        "--engine",
        "generic",
        "--no-cuda-graphs",  # this server runs its step eagerly
        "--max-tokens",
        "256",
        "--repeat",
        "3",
        "--concurrency",
        "1,2,4,8",
        "--concurrency-max-tokens",
        "128",
        "--out",
        str(out),
    ]
    print("$", " ".join(cmd), flush=True)
    rc = subprocess.call(cmd)
    (out / "standalone_step.json").write_text(
        json.dumps({"weight_bytes": load.bytes, "eager_step_ms_b1": step_ms}, indent=1)
    )
    return rc


if __name__ == "__main__":
    sys.exit(main())
