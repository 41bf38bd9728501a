"""Tensor-parallel decode step of a real architecture with random weights: time per token.

    python experiments/gpu/tp_decode.py --model llama-3.1-70b --tp 2,4,8 --variant default,p2p-off \
        --out experiments/results/tp_decode.json [--profile PROFILE.json] [--gpu h200]
    python experiments/gpu/tp_decode.py --tiny --tp 2 --backend gloo     # CPU smoke test

One process per rank (fresh per TP x variant, so NCCL_* settings apply; NVLink multicast is
always off). Each rank holds its 1/TP shard of every layer, as Megatron-style TP does: fused QKV
and gate_up split by heads / columns, o_proj and down_proj split by rows, followed by an
allreduce of B x hidden (2 per layer, plus one after the vocab-parallel embedding), a
vocab-parallel lm_head and an all-gather of the logits. Attention reads a KV cache of
``--context`` tokens (GQA; KV heads replicated when fewer than TP). MoE layers (Qwen3-MoE /
Mixtral style) run the router, then the routed experts through ``torch._grouped_mm`` so that
only the selected experts' weights are read; the routing itself is drawn at random once and
fixed (random weights route arbitrarily anyway). Not modelled: RoPE, q/k norms, the KV write of
the new token, sampling, MLA attention, shared experts.

Per configuration: the step captured in a CUDA graph and replayed (as engines decode), and
eagerly; median over replays, max over ranks. With ``--profile`` (and ceiling's predict
importable) the same configuration's prediction is recorded beside the measurement. With
``--trace DIR`` the steps are also recorded with torch.profiler; at ``--tp 1`` on one GPU that is
issue 23's evidence (a real GPU trace classified by ceiling.trace, classes + idle against the
CUDA-event step), read by ``experiments/gpu/trace_report.py`` like the multi-GPU traces.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
sys.path.insert(0, str(SRC))

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "num_hidden_layers": 2,
}
TINY_MOE = {**TINY, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


def model_config(name: str, tiny: bool) -> dict:
    """The config.json fields a decode step needs (catalog name or path; nested text_config)."""
    if tiny:
        return dict(TINY_MOE if "moe" in name or "a3b" in name else TINY)
    from ceiling.spec.model import catalog

    path = catalog().get(name) or Path(name)
    if path.is_dir():
        path = path / "config.json"
    cfg = json.loads(Path(path).read_text())
    return cfg.get("text_config", cfg)


# ------------------------------------------------------------------------------------ worker


def worker(spec_path: str) -> int:
    from datetime import timedelta

    from ceiling.probe.rankstage import arm

    arm()  # SIGUSR1 -> every thread's stack in this rank's log (the parent's timeout sends it)
    spec = json.loads(Path(spec_path).read_text())
    rank, tp = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    hang = spec.get("debug_hang") or {}

    def stage(name: str) -> None:
        from ceiling.probe.rankstage import stage as mark

        mark(name)
        if hang.get("rank") == rank and hang.get("stage") == name:
            time.sleep(10**6)  # fault injection for the harness test: this rank stops here

    stage("import torch")
    import torch
    import torch.distributed as dist

    cuda = spec["device"] == "cuda"
    dev = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(dev)
    stage("init_process_group")
    dist.init_process_group(
        spec["backend"],
        rank=rank,
        world_size=tp,
        timeout=timedelta(seconds=spec.get("pg_timeout_s", 600)),
        **({"device_id": dev} if cuda else {}),
    )
    stage("build weights")
    torch.manual_seed(1234 + rank)
    dt = torch.bfloat16
    c, B, S = spec["config"], spec["batch"], spec["context"]
    H, nq = c["hidden_size"], c["num_attention_heads"]
    nkv = c.get("num_key_value_heads", nq)
    hd = c.get("head_dim") or H // nq
    V, L = c["vocab_size"], spec.get("layers") or c["num_hidden_layers"]
    E = c.get("num_experts") or c.get("n_routed_experts") or 0
    K = c.get("num_experts_per_tok") or 0
    hq, hkv = nq // tp, max(1, nkv // tp)
    ep = bool(spec.get("ep")) and E > 0 and tp > 1
    assert not ep or E % tp == 0, f"{E} experts do not split over {tp} ranks"
    routed_here = 0  # (layer, expert) pairs this rank computes: EP's load on this rank
    comm = True  # False: the same step with every collective left out (its cost = the difference)
    assert hq % hkv == 0, f"{hq} query heads per rank over {hkv} KV heads"
    weight_bytes = kv_bytes = 0

    def w(*shape):
        nonlocal weight_bytes
        t = torch.empty(shape, dtype=dt, device=dev).normal_(0, 0.02)
        weight_bytes += t.numel() * t.element_size()
        return t

    def kv(*shape):
        nonlocal kv_bytes
        t = torch.empty(shape, dtype=dt, device=dev).normal_(0, 1.0)
        kv_bytes += t.numel() * t.element_size()
        return t

    gen = torch.Generator().manual_seed(99)  # same routing on every rank
    layers = []
    for _ in range(L):
        d = {
            "ln1": torch.ones(H, dtype=dt, device=dev),
            "ln2": torch.ones(H, dtype=dt, device=dev),
            "wqkv": w((hq + 2 * hkv) * hd, H),
            "wo": w(H, hq * hd),
            "k": kv(B, hkv, S, hd),
            "v": kv(B, hkv, S, hd),
        }
        if E:
            if ep:  # whole experts, E/tp of them on each rank
                ie, lo, hi = c["moe_intermediate_size"], rank * E // tp, (rank + 1) * E // tp
            else:  # every expert on every rank, 1/tp of its intermediate columns
                ie, lo, hi = c["moe_intermediate_size"] // tp, 0, E
            d.update(router=w(E, H), w13=w(hi - lo, 2 * ie, H), w2=w(hi - lo, H, ie))
            d["route"] = _routing(torch, gen, B, E, K, dev, lo, hi)
            routed_here += len(d["route"][3])
        else:
            inter = c["intermediate_size"] // tp
            d.update(wgu=w(2 * inter, H), wd=w(H, inter))
        layers.append(d)
    lnf = torch.ones(H, dtype=dt, device=dev)
    lm = w(V // tp, H)
    x_in = torch.randn(B, H, dtype=dt, device=dev)
    gathered = torch.empty(tp * B, V // tp, dtype=dt, device=dev)
    moe_impl = spec.get("moe_impl", "auto")
    if moe_impl == "auto":
        moe_impl = "grouped_mm" if hasattr(torch, "_grouped_mm") else "loop"
    attn_impl = spec.get("attn_impl", "sdpa")

    def rms(x, g):
        return torch.nn.functional.rms_norm(x, (H,), g, 1e-6)

    trace = spec.get("trace")
    all_reduce, all_gather = dist.all_reduce, dist.all_gather_into_tensor
    if not cuda:
        # gloo runs a collective on its own thread while the caller blocks in work.wait(),
        # which no operator encloses: a CPU trace would show the wait as idle. The same call
        # wrapped in an operator of its own keeps the wait inside the collective's time, as an
        # NCCL kernel on a GPU stream does (trace pattern: ceiling_tp::* in generic.yaml).
        all_reduce, all_gather = _blocking_collectives(torch, dist)

    def ar(x):
        if tp > 1 and comm:
            all_reduce(x)
        return x

    def attention(a, d):
        nonlocal attn_impl
        qkv = a @ d["wqkv"].t()
        if attn_impl == "sdpa":
            try:
                q = qkv[:, : hq * hd].reshape(B, hq, 1, hd)
                o = torch.nn.functional.scaled_dot_product_attention(
                    q, d["k"], d["v"], enable_gqa=True
                ).reshape(B, hq * hd)
                return o @ d["wo"].t()
            except (RuntimeError, TypeError):
                attn_impl = "manual"
        q = qkv[:, : hq * hd].reshape(B, hkv, hq // hkv, hd)
        s = torch.matmul(q, d["k"].transpose(-1, -2)) * (hd**-0.5)
        p = torch.softmax(s.float(), dim=-1).to(dt)
        o = torch.matmul(p, d["v"]).reshape(B, hq * hd)
        return o @ d["wo"].t()

    def mlp(a, d):
        gu = a @ d["wgu"].t()
        g, u = gu.chunk(2, dim=-1)
        return (torch.nn.functional.silu(g) * u) @ d["wd"].t()

    def moe(a, d):
        nonlocal moe_impl
        rows, slots, offs, experts = d["route"]
        if not experts:  # EP: no token routed to this rank's experts in this layer
            return torch.zeros(B, H, dtype=dt, device=dev)
        vals = torch.softmax((a @ d["router"].t()).float(), dim=-1).topk(K, dim=-1).values.to(dt)
        wts = vals.reshape(-1).index_select(0, slots)
        xs = a.index_select(0, rows)
        if moe_impl == "grouped_mm":
            try:
                h = torch._grouped_mm(xs, d["w13"].transpose(-2, -1), offs=offs)
                g, u = h.chunk(2, dim=-1)
                y = torch._grouped_mm(
                    (torch.nn.functional.silu(g) * u).contiguous(),
                    d["w2"].transpose(-2, -1),
                    offs=offs,
                )
            except (RuntimeError, TypeError):
                moe_impl = "loop"
        if moe_impl == "loop":
            parts, start = [], 0
            for e, n in experts:  # host-known routing: views of the active experts only
                xe = xs[start : start + n]
                g, u = (xe @ d["w13"][e].t()).chunk(2, dim=-1)
                parts.append((torch.nn.functional.silu(g) * u) @ d["w2"][e].t())
                start += n
            y = torch.cat(parts)
        out = torch.zeros(B, H, dtype=dt, device=dev)
        return out.index_add_(0, rows, y * wts[:, None])

    def step():
        h = ar(x_in.clone())  # vocab-parallel embedding ends in an allreduce
        for d in layers:
            h = h + ar(attention(rms(h, d["ln1"]), d))
            a = rms(h, d["ln2"])
            h = h + ar(moe(a, d) if E else mlp(a, d))
        logits = rms(h, lnf) @ lm.t()
        if tp > 1 and comm:
            all_gather(gathered, logits)
        else:
            gathered.copy_(logits)
        return h

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def agree_max(v):
        t = torch.tensor([v], dtype=torch.float64 if not cuda else torch.float32, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    stage("first step")
    h = step()
    sync()
    stage("consistency check")
    finite = bool(torch.isfinite(h).all() and torch.isfinite(gathered).all())
    # every rank must hold the same hidden state after the allreduces
    spread = h.float().clone()
    lo = spread.clone()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    consistent = bool(torch.equal(spread, lo))

    def timed(fn, n):
        out = []
        for _ in range(n):
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                out.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(out)

    def traced(fn, mode):
        """``trace["steps"]`` steady steps recorded by torch.profiler (CPU ops, and CUPTI's
        kernels on a GPU, graph replays' kernels included) into one gzipped Chrome trace per
        rank, each step also timed on its own clock: CUDA events on the stream (perf_counter on
        a CPU) at every step's start, so step k = mark[k+1] - mark[k], the span the trace's
        ProfilerStep#k annotation covers. Two warm-up steps run first under the profiler (their
        records are dropped: the first call of some operators under a profiler is slow) and
        end in a sync, so the first recorded step starts on an idle
        GPU; one extra step is recorded at the end, as ceiling.trace leaves the last annotated
        step out (its end is not recorded)."""
        from torch.profiler import ProfilerActivity, profile, schedule

        n = int(trace["steps"])
        d = Path(trace["dir"]) / mode
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"rank{rank}.pt.trace.json.gz"
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        marks: list = []

        def mark():
            if cuda:
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                marks.append(e)
            else:
                marks.append(time.perf_counter())

        sync()
        dist.barrier()
        with profile(
            activities=acts,
            schedule=schedule(wait=0, warmup=2, active=n + 1, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
        ) as prof:
            for i in range(n + 3):
                mark()
                fn()
                if i in (1, n + 2):  # an idle GPU at the first step; every kernel of the
                    sync()  # last one done before the profiler stops and collects
                prof.step()
        sync()
        if cuda:
            steps = [marks[k].elapsed_time(marks[k + 1]) for k in range(2, n + 2)]
        else:
            steps = [(marks[k + 1] - marks[k]) * 1e3 for k in range(2, n + 2)]
        (d / f"steps_rank{rank}.json").write_text(
            json.dumps(
                {
                    "schema_version": 1,
                    "rank": rank,
                    "world_size": tp,
                    "mode": mode,
                    "clock": "cuda_events" if cuda else "perf_counter",
                    "trace": path.name,
                    "steps": n,
                    "steps_ms": steps,
                    "what": "ProfilerStep#2..#N+1 of the trace, each timed from its start to the "
                    "next step's start on this clock",
                }
            )
            + "\n"
        )
        dist.barrier()

    dist.barrier()
    stage("eager warm-up")
    for _ in range(spec["warmup"]):
        step()
    sync()
    stage("eager timing")
    eager_ms = agree_max(timed(step, spec["iters_eager"])) if spec["eager"] else None
    if trace and spec["eager"]:
        stage("eager trace")
        traced(step, "eager")
    graph_ms = None
    if cuda and spec["graph"]:
        stage("graph warm-up (side stream)")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(s)
        sync()
        stage("graph capture")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        stage("graph first replay")
        for _ in range(3):
            g.replay()
        sync()
        dist.barrier()
        stage("graph timing")
        graph_ms = agree_max(timed(g.replay, spec["iters_graph"]))
        if trace:
            stage("graph trace")
            traced(g.replay, "graph")
    eager_nc = graph_nc = None
    g = g2 = None
    if tp > 1 and spec.get("no_comm_twin", True):
        # the same step without its collectives, timed the same way: graph_ms - graph_ms_no_comm
        # is what the allreduces cost inside the real step (overlap and launch gaps included)
        comm = False
        stage("no-collective twin")
        if spec["eager"]:
            eager_nc = agree_max(timed(step, spec["iters_eager"]))
        if cuda and spec["graph"]:
            g2 = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g2):
                step()
            for _ in range(3):
                g2.replay()
            sync()
            dist.barrier()
            graph_nc = agree_max(timed(g2.replay, spec["iters_graph"]))
        comm = True
    loads = None
    if ep:
        t = torch.tensor([float(routed_here)], dtype=torch.float32, device=dev)
        all_loads = [torch.zeros_like(t) for _ in range(tp)]
        dist.all_gather(all_loads, t)
        loads = [int(x.item()) for x in all_loads]
    census = None
    if cuda and spec.get("census") and rank == 0:
        # which kernels one step runs, how many and for how long (CUPTI via torch.profiler, an
        # eager step: the same kernels a graph replays): per-op evidence for predict's kernel
        # counts of plain PyTorch, measured rather than assumed
        stage("kernel census")
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            sync()
        kern: dict[str, list[float]] = {}
        for ev in prof.events():
            if str(ev.device_type).endswith("CUDA"):  # kernels and memcpys/memsets on the GPU
                us = getattr(ev, "device_time", None) or getattr(ev, "cuda_time", 0.0)
                kern.setdefault(ev.name, []).append(float(us))
        census = {
            "layers": L,
            "kernels_per_step": sum(len(v) for v in kern.values()),
            "gpu_us_per_step": sum(sum(v) for v in kern.values()),
            "by_kernel": sorted(
                ({"name": k[:160], "count": len(v), "us": sum(v)} for k, v in kern.items()),
                key=lambda r: -r["us"],
            ),
        }
    stage("write result")
    if rank == 0:
        result = {
                    "eager_ms": eager_ms,
                    "graph_ms": graph_ms,
                    "eager_ms_no_comm": eager_nc,
                    "graph_ms_no_comm": graph_nc,
                    "comm_in_step_graph_ms": None
                    if graph_ms is None or graph_nc is None
                    else graph_ms - graph_nc,
                    "comm_in_step_eager_ms": None
                    if eager_ms is None or eager_nc is None
                    else eager_ms - eager_nc,
                    "ep": ep,
                    "ep_routed_experts_per_rank": loads,
                    "kernel_census": census,
                    "weights_GB_per_rank": weight_bytes / 1e9,
                    "kv_GB_per_rank": kv_bytes / 1e9,
                    "allreduces_per_step": (2 * L + 1) if tp > 1 else 0,
                    "layers": L,
                    "moe_impl": moe_impl if E else None,
                    "attn_impl": attn_impl,
                    "finite": finite,
                    "ranks_consistent": consistent,
                    "device_name": torch.cuda.get_device_name(dev) if cuda else "cpu",
                    "torch": torch.__version__,
                    "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
                    "allgathers_per_step": 1 if tp > 1 else 0,
                    "allreduce_bytes": B * H * torch.finfo(dt).bits // 8,
                    "hidden_size": H,
                    "trace_modes": (["eager"] if spec["eager"] else [])
                    + (["graph"] if cuda and spec["graph"] else [])
                    if trace
                    else [],
        }  # fmt: skip
        Path(spec["out"]).write_text(json.dumps(result))
        if trace:  # the configuration beside its traces: the report needs nothing else
            Path(trace["dir"]).mkdir(parents=True, exist_ok=True)
            cfg_doc = {**spec.get("row", {}), **result, "schema_version": 1}
            Path(trace["dir"], "config.json").write_text(json.dumps(cfg_doc, indent=1) + "\n")
    # NCCL will not release a communicator that a live CUDA graph captured: commDestroySync
    # polls "until all graphs referencing us die" (src/init.cc, localPersistentRefs), so a
    # graph still alive here made destroy_process_group wait forever (the TP >= 2 hang of
    # issue 10: every row measured, no rank exiting). The graphs go first.
    stage("release graphs")
    g = g2 = None
    gc.collect()
    sync()
    stage("final barrier")
    dist.barrier()
    stage("destroy_process_group")
    dist.destroy_process_group()
    stage("done")
    return 0


_BLOCKING: tuple | None = None


def _blocking_collectives(torch, dist):
    """all_reduce / all_gather_into_tensor as operators that return when the collective has
    finished (torch.library custom ops: the profiler records each call as one ``cpu_op``)."""
    global _BLOCKING
    if _BLOCKING is None:
        # schemas spelled out: this module's annotations are strings (from __future__)
        all_reduce = torch.library.custom_op(
            "ceiling_tp::all_reduce",
            dist.all_reduce,
            mutates_args=("x",),
            schema="(Tensor(a!) x) -> ()",
        )
        all_gather = torch.library.custom_op(
            "ceiling_tp::all_gather", dist.all_gather_into_tensor, mutates_args=("out",),
            schema="(Tensor(a!) out, Tensor x) -> ()",
        )  # fmt: skip
        _BLOCKING = (all_reduce, all_gather)
    return _BLOCKING


def _routing(torch, gen, B, E, K, dev, lo=0, hi=None):
    """Random top-K experts per token (the same draw on every rank), kept for the experts
    ``lo..hi-1`` this rank holds, sorted by expert: (rows, slots, offs, [(local expert, n)])."""
    hi = E if hi is None else hi
    pairs = []
    for b in range(B):
        for j, e in enumerate(torch.randperm(E, generator=gen)[:K].tolist()):
            if lo <= e < hi:
                pairs.append((e - lo, b, j))
    pairs.sort()
    counts = [0] * (hi - lo)
    for e, _, _ in pairs:
        counts[e] += 1
    rows = torch.tensor([b for _, b, _ in pairs], device=dev)
    slots = torch.tensor([b * K + j for _, b, j in pairs], device=dev)
    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32).to(dev)
    experts = [(e, n) for e, n in enumerate(counts) if n]
    return rows, slots, offs, experts


# ------------------------------------------------------------------------------------ parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="llama-3.1-70b", help="catalog name(s), comma-separated")
    ap.add_argument("--tp", default="2", help="e.g. 1,2,4,8")
    ap.add_argument("--variant", default="default", help="commbench presets, e.g. default,p2p-off")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=None, help="override the layer count")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke test)")
    ap.add_argument("--backend", default="auto", help="auto | nccl | gloo")
    ap.add_argument("--no-eager", action="store_true")
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--moe-impl", default="auto", help="auto | grouped_mm | loop")
    ap.add_argument("--attn-impl", default="sdpa", help="sdpa | manual")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--profile", help="hardware profile for predict's number (calibrate+commbench)")
    ap.add_argument(
        "--gpu", default=None, help="catalog GPU for predict (default: from the profile)"
    )
    ap.add_argument("--link", default=None, help="catalog link kind for predict (default: probe)")
    ap.add_argument(
        "--engine",
        default="generic",
        help="the engine predict is asked about: generic (default) = plain PyTorch kernels and "
        "no engine host loop, which is what this step runs",
    )
    ap.add_argument(
        "--parallel",
        default="tp",
        help="tp,ep: how MoE layers split over the ranks (ep: whole experts per rank, as "
        "vLLM's --enable-expert-parallel; dense models run tp only)",
    )
    ap.add_argument(
        "--no-comm-twin",
        action="store_true",
        help="skip timing the same step without its collectives (the in-step allreduce cost)",
    )
    ap.add_argument(
        "--census",
        action="store_true",
        help="also count the kernels of one eager step (torch.profiler, rank 0, CUDA only)",
    )
    ap.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="DIR",
        help="record steady steps with torch.profiler on every rank (graph and eager): "
        "DIR/<configuration>/<mode>/rank<R>.pt.trace.json.gz, each step also timed with CUDA "
        "events (perf_counter on a CPU) in steps_rank<R>.json; config.json beside them",
    )
    ap.add_argument(
        "--trace-steps", type=int, default=8, help="steps recorded per trace (default 8)"
    )
    ap.add_argument("--logs", type=Path, default=None, help="keep every rank's log under DIR")
    ap.add_argument(
        "--stop-on-error",
        action="store_true",
        help="stop at the first configuration that fails (a canary run)",
    )
    ap.add_argument(
        "--debug-hang",
        default=None,
        metavar="RANK:STAGE",
        help="fault injection for testing the harness: RANK sleeps at STAGE",
    )
    ap.add_argument(
        "--repredict",
        type=Path,
        default=None,
        metavar="RESULT.json",
        help="no measurement: recompute predict's columns of a saved result with --profile",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    if args.repredict:
        return repredict(args)
    import signal

    def _term(signum, frame):  # `timeout` sends SIGTERM: unwind like Ctrl-C, keeping the record
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)

    from ceiling.probe.commbench import resolve_variants

    cuda, n_gpus = _cuda_facts()
    backend = args.backend if args.backend != "auto" else ("nccl" if cuda else "gloo")
    device = "cuda" if backend == "nccl" else "cpu"
    link = args.link or _probe_link()
    hang = None
    if args.debug_hang:
        r, _, st = args.debug_hang.partition(":")
        hang = {"rank": int(r), "stage": st}
    rows: list[dict] = []
    configs = []
    for model in args.model.split(","):
        cfg = model_config(model, args.tiny)
        moe = bool(cfg.get("num_experts") or cfg.get("n_routed_experts"))
        for tp in [int(x) for x in args.tp.split(",")]:
            if device == "cuda" and tp > n_gpus:
                print(f"skip {model} TP={tp}: {n_gpus} GPU(s)", flush=True)
                continue
            for mode in args.parallel.split(","):
                if mode == "ep" and (not moe or tp == 1):
                    continue  # EP needs experts and more than one rank
                for vname, venv in resolve_variants(args.variant.split(","), []):
                    if tp == 1 and vname != "default":
                        continue  # no collective at TP=1: variants change nothing
                    configs.append((model, cfg, tp, mode, vname, venv))
    try:
        return _run_configs(args, configs, rows, hang, device, backend, link)
    except KeyboardInterrupt:  # between configurations: the rows are on disk already
        print("interrupted: rows so far saved", flush=True)
        return 130


def _run_configs(args, configs, rows, hang, device, backend, link) -> int:
    import tempfile

    from ceiling.probe.ranks import run_ranks

    for model, cfg, tp, mode, vname, venv in configs:
        base = {
            "model": model,
            "tp": tp,
            "parallel": mode,
            "variant": vname,
            "env": venv,
            "batch": args.batch,
            "context": args.context,
            "backend": backend,
        }
        # a cut-off (the caller's timeout) still finds which configuration was running
        _save(args.out, rows, link, args.profile, running=base)
        print(f"running {_name(base)} ...", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            spec = {
                "device": device,
                "backend": backend,
                "config": cfg,
                "batch": args.batch,
                "context": args.context,
                "layers": args.layers,
                "moe_impl": args.moe_impl,
                "attn_impl": args.attn_impl,
                "warmup": 3,
                "eager": not args.no_eager,
                "graph": not args.no_graph,
                "iters_eager": max(3, args.iters // 3),
                "iters_graph": args.iters,
                "census": args.census,
                "ep": mode == "ep",
                "no_comm_twin": not args.no_comm_twin,
                "pg_timeout_s": max(30, int(args.timeout)),
                "debug_hang": hang,
                "out": str(Path(tmp, "r.json")),
                "trace": {"dir": str(args.trace / _slug(base)), "steps": args.trace_steps}
                if args.trace
                else None,
                "row": base,
            }
            Path(tmp, "spec.json").write_text(json.dumps(spec))
            t0 = time.time()
            logs = args.logs / _slug(base) if args.logs else None
            interrupted = False
            try:
                res = run_ranks(
                    [
                        sys.executable,
                        str(Path(__file__).resolve()),
                        "--worker",
                        str(Path(tmp, "spec.json")),
                    ],
                    tp,
                    venv,
                    args.timeout,
                    keep_logs=logs,
                )
            except KeyboardInterrupt as exc:
                res = getattr(exc, "ranks_outcome", None)
                interrupted = True
            row = {**base, "wall_s": round(time.time() - t0, 1)}
            if args.trace:
                row["trace_dir"] = _slug(base)  # under --trace DIR
            measured = Path(spec["out"]).is_file()  # rank 0 writes it once every rank agreed
            if measured:
                row.update(json.loads(Path(spec["out"]).read_text()))
            if res is None or not res.ok:
                why = res.describe() if res is not None else "interrupted"
                if measured:  # the numbers stand; what went wrong after them is on record
                    row["teardown_error"] = why
                else:
                    row["error"] = why
                if res is not None:
                    row["ranks"] = res.to_json()
        if args.layers:
            row["predicted_error"] = "--layers overrides the depth: predict is for the full model"
        elif not args.tiny and "error" not in row:
            row.update(_predicted(row, args, link))
        rows.append(row)
        print(_line(row), flush=True)
        if "error" in row or "teardown_error" in row:
            if "teardown_error" in row:
                print(f"  measured, but the ranks failed after: {row['teardown_error']}")
            for r in row.get("ranks", {}).get("ranks", []):
                print(f"  rank{r['rank']} last words:", flush=True)
                for ln in r["last_words"][-15:]:
                    print(f"    {ln}", flush=True)
        _save(args.out, rows, link, args.profile)  # a cut-off keeps what was measured
        if interrupted:
            print("interrupted: rows so far saved", flush=True)
            return 130
        if "error" in row and args.stop_on_error:
            print("stopping at the first failure (--stop-on-error)", flush=True)
            break
    _save(args.out, rows, link, args.profile)
    return 0 if rows and all("error" not in r for r in rows) else 1


def _name(r: dict) -> str:
    par = "" if r.get("parallel", "tp") == "tp" else f" {r['parallel'].upper()}"
    return f"{r['model']} TP={r['tp']}{par} {r['variant']}"


def _slug(r: dict) -> str:
    # batch 1 keeps the folder names recorded before the batch was part of them
    b = "" if r.get("batch", 1) == 1 else f"_b{r['batch']}"
    return f"{r['model']}_tp{r['tp']}_{r.get('parallel', 'tp')}_{r['variant']}{b}"


def _save(
    out: Path | None,
    rows: list[dict],
    link: str | None,
    profile: str | None,
    running: dict | None = None,
) -> None:
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "schema_version": 1,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "what": "TP decode step, random weights, bf16",
        "link": link,
        "profile": profile,
        "rows": rows,
        "running": running,  # the configuration in flight when this file was written, if any
    }
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out)


def _line(r: dict) -> str:
    if "error" in r:
        return f"{_name(r)}: ERROR {r['error']}"
    pred = r.get("predicted_graph_ms")
    comm = r.get("comm_in_step_graph_ms")
    return (
        f"{_name(r)}: graph {r['graph_ms']} ms, eager {r['eager_ms']} ms"
        + (f" (collectives in step {comm:.3f} ms)" if comm is not None else "")
        + ", "
        f"weights/rank {r['weights_GB_per_rank']:.2f} GB, kv/rank {r['kv_GB_per_rank']:.3f} GB"
        + (f", predicted {pred:.3f} ms (graph)" if pred else "")
        + ("" if r.get("finite", True) and r.get("ranks_consistent", True) else " [CHECK FAILED]")
    )


def _cuda_facts() -> tuple[bool, int]:
    try:
        import torch
    except ImportError:
        sys.exit("tp_decode needs PyTorch (pip install 'ceiling[torch]')")
    return torch.cuda.is_available(), torch.cuda.device_count()


def _probe_link() -> str | None:
    try:
        from ceiling.probe.topology import probe

        t = probe()
        return t.link_for([g.index for g in t.gpus])
    except Exception:
        return None


def _predicted(row: dict, args: argparse.Namespace, link: str | None) -> dict:
    """predict's numbers for the same configuration (graph and eager), or why not.

    The step here runs NCCL through torch.distributed, so predict is asked for NCCL allreduces
    (not the engine's custom allreduce); with a profile, the collective fits are the ones
    measured under the row's own NCCL setting (a p2p-off row is predicted with p2p-off fits)."""
    try:
        from ceiling.predict.api import PredictRequest, predict
        from ceiling.spec.profile import load_profile

        prof = load_profile(args.profile) if args.profile else None
        gpu = args.gpu or (prof.gpu if prof else None) or "h200"
        tp = row["tp"]
        if prof is None and link and (row.get("env") or {}).get("NCCL_P2P_DISABLE") == "1":
            from ceiling.spec.hardware import list_links

            if f"{link}-nop2p" in {lk.name for lk in list_links()}:  # the twin without P2P
                link = f"{link}-nop2p"
        with _variant_profile(prof, row.get("env") or {}) as prof_path:
            out: dict = {
                "predicted_with": {
                    "gpu": gpu,
                    "link": link,
                    "profile": args.profile,
                    "engine": args.engine,
                }
            }
            for graphs in (True, False):
                p = predict(
                    PredictRequest(
                        model=row["model"],
                        gpu=gpu,
                        tp=tp,
                        ep=tp if row.get("parallel") == "ep" else 1,
                        link=link if tp > 1 else None,
                        allreduce="nccl",
                        engine=args.engine,
                        batch=row.get("batch", args.batch),
                        context=row.get("context", args.context),
                        cuda_graphs=graphs,
                        profile=prof_path,
                    )
                ).model_dump()
                key = "graph" if graphs else "eager"
                out[f"predicted_{key}_ms"] = p["decode_ms_per_token"]
                out[f"predicted_{key}_components_ms"] = p["components_ms"]
                for extra in ("bound", "expected"):  # predict v2's two figures, when present
                    if isinstance(p.get(extra), dict):
                        out[f"predicted_{key}_{extra}_ms"] = p[extra].get("decode_ms_per_token")
        return out
    except Exception as exc:  # the measurement stands on its own
        return {"predicted_error": f"{type(exc).__name__}: {exc}"[:300]}


class _variant_profile:
    """A temporary copy of the profile whose collective fits are those measured under the
    row's NCCL environment (safety variables aside); the path, or None without a profile."""

    def __init__(self, prof, env: dict) -> None:
        self.prof, self.env, self.path = prof, env, None

    def __enter__(self) -> str | None:
        if self.prof is None:
            return None
        import tempfile

        from ceiling.probe.ranks import always_env

        safe = set(always_env())

        def tuning(e: dict) -> dict:
            return {k: v for k, v in e.items() if k not in safe}

        want = tuning(self.env)
        fits = [c for c in self.prof.collectives if tuning(c.env) == want]
        data = self.prof.model_copy(update={"collectives": fits})
        fd, self.path = tempfile.mkstemp(suffix=".json", prefix="ceiling-profile-")
        with os.fdopen(fd, "w") as f:
            f.write(data.model_dump_json())
        return self.path

    def __exit__(self, *exc) -> None:
        if self.path:
            os.unlink(self.path)


def repredict(args: argparse.Namespace) -> int:
    """Recompute the predicted columns of a saved result (a newer predict, another profile)."""
    doc = json.loads(args.repredict.read_text())
    link = args.link or doc.get("link")
    for row in doc["rows"]:
        for k in [k for k in row if k.startswith("predicted")]:
            del row[k]
        full = None if args.tiny else model_config(row["model"], False).get("num_hidden_layers")
        if "error" in row or args.tiny:
            pass
        elif row.get("layers") not in (None, full):
            row["predicted_error"] = "--layers overrides the depth: predict is for the full model"
        else:
            row.update(_predicted(row, args, link))
        print(_line(row), flush=True)
    doc["profile"] = args.profile
    doc["repredicted"] = datetime.now(UTC).isoformat(timespec="seconds")
    out = args.out or args.repredict
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
