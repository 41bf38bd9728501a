"""A decode step of a real shape on one GPU, recorded with torch.profiler and timed with CUDA
events: the evidence that ``ceiling.trace`` classifies a GPU trace and that its classes + idle
add up to the independently timed step (issue 23).

    python3 bench/gpu/trace_decode.py --out DIR [--steps 6] [--context 1024]

Per shape (Llama-3.1-8B; Qwen3-30B-A3B as the MoE) and batch, bf16 random weights: the step is
captured in a CUDA graph and replayed (as engines decode), and run eagerly. Kernels: cuBLAS
GEMMs (fused QKV, o_proj, gate_up, down, lm_head, the router), SDPA over a KV cache of
``--context`` tokens (flash attention where the backend takes it), RMSNorm, RoPE-free rotary
stand-in (none), SiLU-and-mul, residual adds, the KV write of the new token, top-k routing and
the selected experts (host-fixed routing: random weights route arbitrarily, and a graph needs
fixed shapes), argmax sampling. One GPU: no collectives (TP needs two; issues 28/29).

Each configuration writes ``<name>.pt.trace.json.gz`` (``--steps`` steps, each a
``ProfilerStep#N`` with the GPU synchronised at its end, so the step's kernels lie inside it) and
a row in ``trace_decode.json``: the CUDA-event step (median of 50, untraced), the CUDA-event
time of every traced step, and the per-step device time the profiler saw. Classification runs
elsewhere (the device image has no pydantic): ``bench/gpu/trace_classify.py``.
Needs only torch (CUDA); no ceiling import.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = {
    # config.json fields of the public models (meta-llama/Llama-3.1-8B, Qwen/Qwen3-30B-A3B)
    "llama-3.1-8b": dict(
        hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, inter=14336, vocab=128256
    ),
    "qwen3-30b-a3b": dict(
        hidden=2048,
        layers=48,
        heads=32,
        kv_heads=4,
        head_dim=128,
        inter=0,
        vocab=151936,
        experts=128,
        top_k=8,
        moe_inter=768,
    ),
}


def build(shape: dict, batch: int, context: int, dev: torch.device):
    dt = torch.bfloat16
    H, L, nh, nkv, hd = (shape[k] for k in ("hidden", "layers", "heads", "kv_heads", "head_dim"))
    E = shape.get("experts", 0)
    gen = torch.Generator(device=dev).manual_seed(0)

    def w(*s):
        return (torch.randn(*s, device=dev, dtype=dt, generator=gen) * 0.02).contiguous()

    layers = []
    for _ in range(L):
        d = {
            "ln1": torch.ones(H, device=dev, dtype=dt),
            "ln2": torch.ones(H, device=dev, dtype=dt),
            "qkv": w((nh + 2 * nkv) * hd, H),
            "o": w(H, nh * hd),
            "k_cache": w(batch, nkv, context + 8, hd),
            "v_cache": w(batch, nkv, context + 8, hd),
        }
        if E:
            # the router sees every expert; only the top_k the fixed routing selects are
            # allocated (a step reads no other expert's weights)
            d["router"] = w(E, H)
            d["w13"] = w(shape["top_k"], 2 * shape["moe_inter"], H)
            d["w2"] = w(shape["top_k"], H, shape["moe_inter"])
        else:
            d["gate_up"] = w(2 * shape["inter"], H)
            d["down"] = w(H, shape["inter"])
        layers.append(d)
    embed = w(shape["vocab"], H)
    lm = w(shape["vocab"], H)
    lnf = torch.ones(H, device=dev, dtype=dt)
    tokens = torch.zeros(batch, dtype=torch.long, device=dev)
    pos = torch.tensor([context], device=dev)
    # host-fixed routing: the same top_k experts every step (a graph needs fixed shapes)
    chosen = list(range(shape["top_k"])) if E else []

    def rms(x, g):
        return F.rms_norm(x, (H,), g, 1e-6)

    def attention(x, d):
        qkv = x @ d["qkv"].t()
        q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        q = q.view(batch, nh, 1, hd)
        d["k_cache"].index_copy_(2, pos, k.view(batch, nkv, 1, hd))  # the new token's KV
        d["v_cache"].index_copy_(2, pos, v.view(batch, nkv, 1, hd))
        kc = d["k_cache"][:, :, : context + 1]
        vc = d["v_cache"][:, :, : context + 1]
        o = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
        return o.reshape(batch, nh * hd) @ d["o"].t()

    def mlp(x, d):
        g, u = (x @ d["gate_up"].t()).chunk(2, dim=-1)
        return (F.silu(g) * u) @ d["down"].t()

    def moe(x, d):
        logits = x @ d["router"].t()
        wts, _ = torch.topk(torch.softmax(logits.float(), dim=-1), shape["top_k"], dim=-1)
        out = torch.zeros_like(x)
        for j, e in enumerate(chosen):
            g, u = (x @ d["w13"][e].t()).chunk(2, dim=-1)
            y = (F.silu(g) * u) @ d["w2"][e].t()
            out = out + y * wts[:, j : j + 1].to(x.dtype)
        return out

    def step():
        h = embed[tokens]
        for d in layers:
            h = h + attention(rms(h, d["ln1"]), d)
            a = rms(h, d["ln2"])
            h = h + (moe(a, d) if E else mlp(a, d))
        logits = rms(h, lnf) @ lm.t()
        tokens.copy_(torch.argmax(logits, dim=-1))
        return h

    # bytes one step reads: every weight but the embedding table (one row) and the KV caches
    weight_bytes = (
        sum(
            t.numel() * t.element_size()
            for d in layers
            for k, t in d.items()
            if k not in ("k_cache", "v_cache")
        )
        + lm.numel() * lm.element_size()
    )
    return step, weight_bytes


def events_ms(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def run_one(name: str, shape: dict, batch: int, mode: str, args, dev) -> dict:
    t0 = time.time()
    step, weight_bytes = build(shape, batch, args.context, dev)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    fn = step
    if mode == "graph":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        fn = g.replay
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    untraced = events_ms(fn, 50 if mode == "graph" else 20)
    from torch.profiler import ProfilerActivity, profile, record_function

    traced: list[float] = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        events_ms(fn, 1)  # the profiler's own start-up lands outside the marked steps
        for i in range(args.steps):
            # torch's own step marker (what a schedule writes), with the GPU synchronised
            # before it closes, so each step's kernels lie inside it
            with record_function(f"ProfilerStep#{i}"):
                traced += events_ms(fn, 1)
    tag = f"{name}-b{batch}-{mode}"
    raw = Path(args.out) / f"{tag}.pt.trace.json"
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.open(f"{raw}.gz", "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    dev_us = [0.0]
    kernels = 0
    for ev in prof.events():
        if str(ev.device_type).endswith("CUDA"):
            dev_us[0] += float(getattr(ev, "device_time", 0.0) or 0.0)
            kernels += 1
    row = {
        "name": tag,
        "model": name,
        "batch": batch,
        "mode": mode,
        "context": args.context,
        "event_ms_untraced_median": statistics.median(untraced),
        "event_ms_untraced_p10_p90": [
            statistics.quantiles(untraced, n=10)[0],
            statistics.quantiles(untraced, n=10)[-1],
        ],
        "event_ms_traced": traced,
        "profiled_steps": args.steps,
        "device_kernel_ms_per_step": dev_us[0] / 1e3 / args.steps,
        "kernels_per_step": kernels / args.steps,
        "weights_GB_read_per_step": weight_bytes / 1e9,
        "trace_file": f"{tag}.pt.trace.json.gz",
        "trace_MB": os.path.getsize(f"{raw}.gz") / 1e6,
        "wall_s": round(time.time() - t0, 1),
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--models", default="llama-3.1-8b,qwen3-30b-a3b")
    ap.add_argument("--batches", default="1")
    ap.add_argument("--modes", default="graph,eager")
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    rows = []
    meta = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            for mode in args.modes.split(","):
                try:
                    rows.append(run_one(name, SHAPES[name], batch, mode, args, dev))
                except Exception as exc:  # keep the other configurations' rows
                    rows.append({"name": f"{name}-b{batch}-{mode}", "error": repr(exc)[:400]})
                    print(rows[-1], flush=True)
                torch.cuda.empty_cache()
        (Path(args.out) / "trace_decode.json").write_text(
            json.dumps({"schema_version": 1, **meta, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
