"""Does a second CUDA stream hide a MoE shared expert at decode? Measured on this GPU.

``ceiling.predict.overlap`` models the engines' shared-expert stream (vLLM, SGLang) as
``pair = max(main, aux, both weight reads at the bandwidth)``: the shorter stream's fixed costs
hide, never the bytes. This script measures that on real kernels, per MoE layer shape, at one
token, in CUDA graphs:

- main: router GEMV, softmax + top-k, the top-k experts' gate_up and down as batched matmuls
  over their weights (a stand-in for the engines' fused grouped GEMM: same bytes, cuBLAS
  kernels), SiLU-and-mul, the weighted sum;
- aux: the shared expert's gate_up GEMV, SiLU-and-mul, down GEMV;
- T_main and T_aux alone, T_line (both on one stream), T_two (aux on a second stream, forked
  and joined with events as vLLM's ``SharedExperts.maybe_forward_async`` does).

Every layer of the graph has its own weights (a model's layers do), so the weights stream from
DRAM as in a decode step. The bandwidth for the model's floor is this GPU's large-GEMV rate,
measured here. One row per shape: the four times, the model's pair, and the share of the
shorter stream hidden, measured and modelled. bf16 throughout (the H200 has no FP4 and the
Marlin INT4 kernels are vLLM's): the kernels differ from an INT4/NVFP4 engine's, the question
(do two decode-sized streams of small kernels overlap) does not.

    python experiments/gpu/stream_overlap.py [--layers 16] [--json OUT.json]   # PyTorch alone
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass

# (name, hidden, routed experts, top-k, expert inter per rank, shared inter per rank)
SHAPES = [
    ("kimi-k2.5 TP8", 7168, 384, 8, 256, 256),
    ("qwen3.5-397b-a17b TP4", 4096, 512, 10, 256, 256),
    ("qwen3.6-35b-a3b TP1", 2048, 256, 8, 512, 512),
    ("glm-4.6 TP8", 5120, 160, 8, 192, 192),
]


@dataclass
class Row:
    shape: str
    main_us: float
    aux_us: float
    line_us: float
    two_us: float
    floor_us: float
    model_pair_us: float
    hidden_measured_pct: float
    hidden_modelled_pct: float


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16, help="layers per graph, each own weights")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print(
            "error: PyTorch is not installed\nfix: run this on a GPU host with torch",
            file=sys.stderr,
        )
        return 4
    if not torch.cuda.is_available():
        print("error: no CUDA GPU visible\nfix: run this on a GPU host", file=sys.stderr)
        return 4
    bw = _gemv_bandwidth(torch, torch.device("cuda"))
    print(
        f"{torch.cuda.get_device_name()}  large-GEMV bandwidth {bw:.0f} GB/s  layers/graph {args.layers}"
    )
    print(f"{'shape':24} {'main':>7} {'aux':>7} {'line':>7} {'two':>7} {'floor':>7} {'model':>7}"
          f" {'hidden meas/model':>18}")  # fmt: skip
    rows = []
    for shape in SHAPES:
        row = _measure(torch, shape, args.layers, bw)
        rows.append(row)
        print(f"{row.shape:24} {row.main_us:7.1f} {row.aux_us:7.1f} {row.line_us:7.1f}"
              f" {row.two_us:7.1f} {row.floor_us:7.1f} {row.model_pair_us:7.1f}"
              f" {row.hidden_measured_pct:8.0f} % /{row.hidden_modelled_pct:4.0f} %")  # fmt: skip
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "bandwidth_GBps": bw,
                       "layers_per_graph": args.layers, "rows": [asdict(r) for r in rows]},
                      fh, indent=2)  # fmt: skip
    return 0


def _measure(torch, shape: tuple, n_layers: int, bw: float) -> Row:
    """The four graph times of one MoE layer shape, per layer, and the model's pair."""
    name, h, n_exp, k, inter, s_inter = shape
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    layers = [
        dict(
            router=torch.randn(n_exp, h, device=dev, dtype=bf16) * 0.01,
            w13=torch.randn(k, 2 * inter, h, device=dev, dtype=bf16) * 0.01,
            w2=torch.randn(k, h, inter, device=dev, dtype=bf16) * 0.01,
            s13=torch.randn(2 * s_inter, h, device=dev, dtype=bf16) * 0.01,
            s2=torch.randn(h, s_inter, device=dev, dtype=bf16) * 0.01,
        )
        for _ in range(n_layers)
    ]
    x = torch.randn(1, h, device=dev, dtype=bf16)
    aux_stream = torch.cuda.Stream()
    silu = torch.nn.functional.silu

    def routed(w):
        logits = x @ w["router"].t()
        wts, _ = torch.topk(torch.softmax(logits.float(), dim=-1), k)
        xs = x.expand(k, -1).unsqueeze(1)  # [k, 1, h]
        g, u = torch.bmm(xs, w["w13"].transpose(1, 2)).chunk(2, dim=-1)
        y = torch.bmm(silu(g) * u, w["w2"].transpose(1, 2))  # [k, 1, h]
        return (y.squeeze(1) * wts.t().to(bf16)).sum(0, keepdim=True)

    def shared(w):
        g, u = (x @ w["s13"].t()).chunk(2, dim=-1)
        return (silu(g) * u) @ w["s2"].t()

    def run_main():
        for w in layers:
            routed(w)

    def run_aux():
        for w in layers:
            shared(w)

    def run_line():
        for w in layers:
            routed(w) + shared(w)

    def run_two():  # vLLM's SharedExperts.maybe_forward_async: fork, run, join
        cur = torch.cuda.current_stream()
        for w in layers:
            aux_stream.wait_stream(cur)
            with torch.cuda.stream(aux_stream):
                s = shared(w)
            r = routed(w)
            cur.wait_stream(aux_stream)
            r + s

    t = {n: _graph_us(torch, fn) / n_layers for n, fn in
         (("main", run_main), ("aux", run_aux), ("line", run_line), ("two", run_two))}  # fmt: skip
    nbytes = 2 * (n_exp * h + k * 3 * inter * h + 3 * s_inter * h)  # router + experts + shared
    floor = nbytes / (bw * 1e9) * 1e6
    model = max(t["main"], t["aux"], floor)
    shorter = min(t["main"], t["aux"])
    meas = (t["line"] - t["two"]) / shorter * 100 if shorter > 0 else 0.0
    modelled = (t["main"] + t["aux"] - model) / shorter * 100 if shorter > 0 else 0.0
    return Row(name, t["main"], t["aux"], t["line"], t["two"], floor, model, meas, modelled)


def _graph_us(torch, fn, replays: int = 20, trials: int = 5) -> float:
    """Median time of one graph replay of ``fn`` (warmed up, captured once), in us.

    Not ``ceiling.probe.calibrate._graphed``: this script runs on GPU hosts with PyTorch alone,
    and ``ceiling.probe`` needs pydantic."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(replays):
            graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / replays)
    del graph
    return statistics.median(times)


def _gemv_bandwidth(torch, dev) -> float:
    """GB/s of a 512 MB bf16 GEMV at one token (the streamed-weights rate of this GPU)."""
    w = torch.randn(16384, 16384, device=dev, dtype=torch.bfloat16)
    x = torch.randn(1, 16384, device=dev, dtype=torch.bfloat16)
    us = _graph_us(torch, lambda: x @ w.t())
    return w.numel() * 2 / (us * 1e-6) / 1e9


if __name__ == "__main__":
    sys.exit(main())
