"""Measure the physical constants `predict` uses for kernel overhead, on the GPU it runs on.

Three measurements, each printed and written as JSON (``--out``):

1. ``graph_empty_us`` / ``eager_launch_us``: cost of one tiny kernel replayed in a CUDA graph,
   and of one eager launch from Python (CPU-bound), from 2,000-kernel sequences.
2. ``gemv``: time of one bf16 GEMV (batch 1) reading S bytes of weights, S from 0.25 MB to
   256 MB, replayed in a CUDA graph over distinct weights (more than the L2 cache). A fit
   t = t0 + S / bw gives the fixed cost ``t0`` of a memory-bound kernel and its bandwidth.
3. ``llama_layer``: a plain-PyTorch Llama-8B-shaped decode layer stack (32 layers, bf16, ctx
   1024, the shape of shared/data/h200_probe.json): kernels per layer (torch.profiler), graph and
   eager step time, and (graph - bytes/bw) / kernels = the per-kernel cost of that implementation.

Needs only PyTorch and a CUDA GPU:  python3 experiments/validation/predict_kernel_cost.py --out kc.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _graph_time_ms(fn, reps: int = 20) -> float:
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def _eager_time_ms(fn, reps: int = 10) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return times[len(times) // 2]


def empty_kernels(n: int = 2000) -> dict:
    import torch

    x = torch.zeros(1, device="cuda")

    def body() -> None:
        for _ in range(n):
            x.add_(1.0)

    g = _graph_time_ms(body)
    e = _eager_time_ms(body)
    return {"kernels": n, "graph_empty_us": g * 1e3 / n, "eager_launch_us": e * 1e3 / n}


def gemv(sizes_mb=(0.25, 0.5, 1, 2, 4, 8, 16, 64, 256), cols: int = 4096) -> dict:
    import torch

    rows_out = []
    for mb in sizes_mb:
        rows = max(1, int(mb * 2**20 / (cols * 2)))
        copies = max(2, int(512 * 2**20 // (rows * cols * 2)))  # > 8x the 60 MB L2
        copies = min(copies, 2000)
        ws = [torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        x = torch.randn(1, cols, device="cuda", dtype=torch.bfloat16)

        def body(ws=ws, x=x) -> None:
            for w in ws:
                torch.nn.functional.linear(x, w)

        ms = _graph_time_ms(body)
        per = ms * 1e3 / copies
        nbytes = rows * cols * 2
        rows_out.append({"MB": nbytes / 2**20, "us": per, "GBps": nbytes / per / 1e3})
        del ws
        torch.cuda.empty_cache()
    # least squares t = t0 + S/bw on all sizes
    xs = [r["MB"] * 2**20 for r in rows_out]
    ys = [r["us"] for r in rows_out]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys, strict=True)) / sum(
        (a - mx) ** 2 for a in xs
    )
    t0 = my - slope * mx
    return {"points": rows_out, "fit_t0_us": t0, "fit_bw_GBps": 1 / slope / 1e3}


def llama_layer(layers: int = 32, ctx: int = 1024, batch: int = 1) -> dict:
    import torch
    import torch.nn.functional as F

    h, inter, heads, kvh, hd, vocab = 4096, 14336, 32, 8, 128, 128256
    dt = torch.bfloat16
    dev = "cuda"

    def w(*s):
        return torch.randn(*s, device=dev, dtype=dt) * 0.02

    L = [
        dict(
            qkv=w((heads + 2 * kvh) * hd, h),
            o=w(h, heads * hd),
            gu=w(2 * inter, h),
            d=w(h, inter),
            n1=torch.ones(h, device=dev, dtype=dt),
            n2=torch.ones(h, device=dev, dtype=dt),
            k=w(batch, kvh, ctx + 1, hd),
            v=w(batch, kvh, ctx + 1, hd),
        )
        for _ in range(layers)
    ]
    lm = w(vocab, h)
    x0 = torch.randn(batch, 1, h, device=dev, dtype=dt)

    def step() -> torch.Tensor:
        x = x0
        for p in L:
            r = x
            x = F.rms_norm(x, (h,), p["n1"])
            qkv = F.linear(x, p["qkv"])
            q, k, v = qkv.split([heads * hd, kvh * hd, kvh * hd], dim=-1)
            q = q.view(batch, 1, heads, hd).transpose(1, 2)
            # write the new token into a preallocated cache (one small copy each), then attend
            p["k"][:, :, ctx].copy_(k.view(batch, kvh, hd))
            p["v"][:, :, ctx].copy_(v.view(batch, kvh, hd))
            a = F.scaled_dot_product_attention(q, p["k"], p["v"], enable_gqa=True)
            x = r + F.linear(a.transpose(1, 2).reshape(batch, 1, heads * hd), p["o"])
            r = x
            x = F.rms_norm(x, (h,), p["n2"])
            g, u = F.linear(x, p["gu"]).chunk(2, dim=-1)
            x = r + F.linear(F.silu(g) * u, p["d"])
        return F.linear(x, lm)

    graph_ms = _graph_time_ms(step)
    eager_ms = _eager_time_ms(step)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = sum(1 for e in prof.events() if e.device_type.name == "CUDA")
    wbytes = sum(t.numel() * 2 for p in L for key, t in p.items() if key not in ("k", "v"))
    wbytes += lm.numel() * 2
    kvbytes = sum(p["k"].numel() * 2 * 2 for p in L)
    return {
        "layers": layers,
        "kernels_per_step": kernels,
        "kernels_per_layer": (kernels - 1) / layers,
        "graph_ms": graph_ms,
        "eager_ms": eager_ms,
        "weight_GB": wbytes / 1e9,
        "kv_GB": kvbytes / 1e9,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--gemv-cols", type=int, nargs="*", default=[],
        help="only the GEMV fit, for these input widths (e.g. 2048 7168 16384)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    import torch

    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    if args.gemv_cols:
        res["gemv_by_cols"] = {}
        for cols in args.gemv_cols:
            g = gemv(cols=cols)
            res["gemv_by_cols"][str(cols)] = g
            print(
                f"cols {cols}: t0 {g['fit_t0_us']:.2f} us, bw {g['fit_bw_GBps']:.0f} GB/s; "
                + ", ".join(f"{p['MB']:.2f}MB {p['us']:.1f}us" for p in g["points"]),
                flush=True,
            )
        if args.out:
            with open(args.out, "w") as f:
                json.dump(res, f, indent=2)
        return 0
    res["empty"] = empty_kernels()
    print("empty kernels:", json.dumps(res["empty"]), flush=True)
    res["gemv"] = gemv()
    for p in res["gemv"]["points"]:
        print(f"  gemv {p['MB']:8.2f} MB  {p['us']:8.2f} us  {p['GBps']:7.0f} GB/s", flush=True)
    print(f"  fit: t0 {res['gemv']['fit_t0_us']:.2f} us, bw {res['gemv']['fit_bw_GBps']:.0f} GB/s")
    res["llama_layer"] = ll = llama_layer()
    bw = res["gemv"]["fit_bw_GBps"]
    floor_ms = (ll["weight_GB"] + ll["kv_GB"]) / bw * 1e3
    ll["floor_ms_at_fit_bw"] = floor_ms
    ll["graph_overhead_us_per_kernel"] = (ll["graph_ms"] - floor_ms) * 1e3 / ll["kernels_per_step"]
    ll["eager_us_per_kernel"] = ll["eager_ms"] * 1e3 / ll["kernels_per_step"]
    print("llama layer:", json.dumps(ll), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
