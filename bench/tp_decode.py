"""Tensor-parallel decode step of a real architecture with random weights: time per token.

    python bench/tp_decode.py --model llama-3.1-70b --tp 2,4,8 --variant default,p2p-off \
        --out bench/results/tp_decode.json [--profile PROFILE.json] [--gpu h200]
    python bench/tp_decode.py --tiny --tp 2 --backend gloo     # CPU smoke test

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
importable) the same configuration's prediction is recorded beside the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
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
    import torch
    import torch.distributed as dist

    spec = json.loads(Path(spec_path).read_text())
    rank, tp = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = spec["device"] == "cuda"
    dev = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group(
        spec["backend"], rank=rank, world_size=tp, **({"device_id": dev} if cuda else {})
    )
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
            ie = c["moe_intermediate_size"] // tp
            d.update(router=w(E, H), w13=w(E, 2 * ie, H), w2=w(E, H, ie))
            d["route"] = _routing(torch, gen, B, E, K, dev)
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

    def ar(x):
        if tp > 1:
            dist.all_reduce(x)
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
        if tp > 1:
            dist.all_gather_into_tensor(gathered, logits)
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

    h = step()
    sync()
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

    dist.barrier()
    for _ in range(spec["warmup"]):
        step()
    sync()
    eager_ms = agree_max(timed(step, spec["iters_eager"])) if spec["eager"] else None
    graph_ms = None
    if cuda and spec["graph"]:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(s)
        sync()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        for _ in range(3):
            g.replay()
        sync()
        dist.barrier()
        graph_ms = agree_max(timed(g.replay, spec["iters_graph"]))
    if rank == 0:
        Path(spec["out"]).write_text(
            json.dumps(
                {
                    "eager_ms": eager_ms,
                    "graph_ms": graph_ms,
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
                }
            )
        )
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _routing(torch, gen, B, E, K, dev):
    """Random top-K experts per token, sorted by expert: (rows, slots, offs, [(expert, n)])."""
    pairs = []
    for b in range(B):
        for j, e in enumerate(torch.randperm(E, generator=gen)[:K].tolist()):
            pairs.append((e, b, j))
    pairs.sort()
    counts = [0] * E
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
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)

    import tempfile

    from ceiling.probe.commbench import resolve_variants
    from ceiling.probe.ranks import run_ranks

    cuda, n_gpus = _cuda_facts()
    backend = args.backend if args.backend != "auto" else ("nccl" if cuda else "gloo")
    device = "cuda" if backend == "nccl" else "cpu"
    link = args.link or _probe_link()
    rows = []
    for model in args.model.split(","):
        cfg = model_config(model, args.tiny)
        for tp in [int(x) for x in args.tp.split(",")]:
            if device == "cuda" and tp > n_gpus:
                print(f"skip {model} TP={tp}: {n_gpus} GPU(s)", flush=True)
                continue
            for vname, venv in resolve_variants(args.variant.split(","), []):
                if tp == 1 and vname != "default":
                    continue  # no collective at TP=1: variants change nothing
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
                        "out": str(Path(tmp, "r.json")),
                    }
                    Path(tmp, "spec.json").write_text(json.dumps(spec))
                    t0 = time.time()
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
                    )
                    row = {
                        "model": model,
                        "tp": tp,
                        "variant": vname,
                        "env": venv,
                        "batch": args.batch,
                        "context": args.context,
                        "backend": backend,
                        "wall_s": round(time.time() - t0, 1),
                    }
                    if res.ok and Path(spec["out"]).is_file():
                        row.update(json.loads(Path(spec["out"]).read_text()))
                    else:
                        row["error"] = res.describe()
                if args.layers:
                    row["predicted_error"] = (
                        "--layers overrides the depth: predict is for the full model"
                    )
                elif not args.tiny and "error" not in row:
                    row.update(_predicted(model, tp, args, link))
                rows.append(row)
                print(_line(row), flush=True)
                _save(args.out, rows, link, args.profile)  # a cut-off keeps what was measured
    _save(args.out, rows, link, args.profile)
    return 0 if rows and all("error" not in r for r in rows) else 1


def _save(out: Path | None, rows: list[dict], link: str | None, profile: str | None) -> None:
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
    }
    out.write_text(json.dumps(result, indent=2) + "\n")


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['model']} TP={r['tp']} {r['variant']}: ERROR {r['error']}"
    pred = r.get("predicted_graph_ms")
    return (
        f"{r['model']} TP={r['tp']} {r['variant']}: graph {r['graph_ms']} ms, eager {r['eager_ms']} ms, "
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


def _predicted(model: str, tp: int, args: argparse.Namespace, link: str | None) -> dict:
    """predict's numbers for the same configuration (graph and eager), or why not."""
    try:
        from ceiling.predict.api import PredictRequest, predict
        from ceiling.spec.profile import load_profile

        gpu = args.gpu or (load_profile(args.profile).gpu if args.profile else None) or "h200"
        out = {}
        for graphs in (True, False):
            p = predict(
                PredictRequest(
                    model=model,
                    gpu=gpu,
                    tp=tp,
                    link=link if tp > 1 else None,
                    batch=args.batch,
                    context=args.context,
                    cuda_graphs=graphs,
                    profile=args.profile,
                )
            ).model_dump()
            key = "graph" if graphs else "eager"
            out[f"predicted_{key}_ms"] = p["decode_ms_per_token"]
            out[f"predicted_{key}_components_ms"] = p["components_ms"]
        return out
    except Exception as exc:  # the measurement stands on its own
        return {"predicted_error": f"{type(exc).__name__}: {exc}"[:300]}


if __name__ == "__main__":
    sys.exit(main())
