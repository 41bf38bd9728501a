"""``ceiling calibrate --ops``: per-operation microbenchmarks at a model's decode shapes.

What ``predict`` needs from the user's own box, op by op, as ``t = t0 + bytes / bw`` per kernel
family (``HardwareProfile.ops``; ``predict --profile`` then marks those ops ``source: profile``):

- ``gemm_bf16``: ``torch.nn.functional.linear`` (cuBLAS) at every dense GEMM shape of the model
  (per TP rank), M = decode batch;
- ``gemm_fp8``: ``torch._scaled_mm`` (cuBLASLt FP8, per-tensor scales; M padded to 16) at the
  same shapes, where the GPU and PyTorch have it;
- ``moe_bf16``: ``torch._grouped_mm`` over the experts a decode step touches (top-k of E per
  token, per-rank expert slices) — PyTorch's grouped GEMM, not an engine's fused MoE kernel;
- ``attn_gqa``: ``scaled_dot_product_attention`` for one query token over the KV cache at the
  model's head layout and contexts; ``attn_mla``: the latent-cache decode (q.k over the
  576-wide latent, softmax, .v over 512) in three batched GEMMs;
- ``elementwise``: one RMSNorm at the hidden size (the fixed cost of a small kernel).

Each shape is timed alone, replayed from a CUDA graph, over enough copies of its weights/KV
that they stream from DRAM (not L2), as a decode step reads them. On a CPU (``--cpu``, the
tests) the same code runs eagerly at toy sizes: it checks the path, it is no GPU's profile.
Published end-to-end numbers never enter here.
"""

from __future__ import annotations

import math
import socket
import statistics
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from ceiling.errors import CeilingError
from ceiling.predict.api import PredictRequest, setup
from ceiling.predict.ops import build_ops
from ceiling.predict.opspec import AttentionShape, GemmShape, MlaShape, MoeShape
from ceiling.probe.calibrate import _graphed, _import_torch, _Timer
from ceiling.probe.topology import catalog_gpu
from ceiling.spec.profile import HardwareProfile, OpFit

SCHEMA_VERSION = 1
DEFAULT_MODELS = ["llama-3.1-8b"]


class OpsConfig(BaseModel):
    device: str = "auto"  # auto | cuda | cpu
    models: list[str] = Field(default_factory=lambda: list(DEFAULT_MODELS))
    tp: int = Field(1, ge=1)
    batches: list[int] = Field(default_factory=lambda: [1, 8])
    contexts: list[int] = Field(default_factory=lambda: [1024, 8192, 32768])
    budget_MiB: float = Field(768.0, description="weights/KV cycled per shape (>> L2)")
    reps: int = 7


class OpPoint(BaseModel):
    family: str
    label: str
    batch: int
    nbytes: int
    us: float


class OpsResult(BaseModel):
    schema_version: int = SCHEMA_VERSION
    created: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    host: str = Field(default_factory=socket.gethostname)
    device: str
    device_name: str
    torch_version: str
    models: list[str]
    tp: int
    points: list[OpPoint] = Field(default_factory=list)
    fits: list[OpFit] = Field(default_factory=list)
    skipped: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


def _shapes(models: list[str], tp: int) -> dict[str, Any]:
    """Decode shapes per family from the models' op lists (one TP rank)."""
    gemm: set[tuple[int, int]] = set()
    moe: set[tuple[int, int, int, int]] = set()
    gqa: set[tuple[int, int, int]] = set()
    mla: set[int] = set()
    hidden: set[int] = set()
    for name in models:
        s, _ = setup(PredictRequest(model=name, gpu="h200", tp=tp, gpus=tp))
        hidden.add(s.spec.hidden)
        for op in build_ops(s, 1, 1024):
            sh = op.shape
            if op.kind == "gemm" and "bmm" not in op.name and isinstance(sh, GemmShape):
                gemm.add((int(sh.n), int(sh.k)))
            elif op.kind == "moe" and isinstance(sh, MoeShape):
                moe.add(
                    (
                        int(sh.experts),
                        int(sh.topk),
                        int(sh.hidden),
                        max(int(sh.inter) // int(sh.moe_tp), 16),
                    )
                )
            elif (
                op.kind == "attention"
                and op.name.startswith("attention")
                and isinstance(sh, AttentionShape)
            ):
                gqa.add((int(sh.heads), int(sh.kv_heads), int(sh.head_dim)))
            elif op.kind == "mla" and isinstance(sh, MlaShape):
                mla.add(int(sh.heads))
    return {
        "gemm": sorted(gemm),
        "moe": sorted(moe),
        "gqa": sorted(gqa),
        "mla": sorted(mla),
        "hidden": sorted(hidden),
    }


def _copies(nbytes: float, budget: float, cap: int = 64) -> int:
    return max(2, min(cap, math.ceil(budget / max(nbytes, 1))))


def run_ops(cfg: OpsConfig, on_progress: Callable[[str], None] | None = None) -> OpsResult:
    torch = _import_torch()
    cuda_ok = torch.cuda.is_available()
    device = cfg.device
    if device == "auto":
        if not cuda_ok:
            raise CeilingError(
                "no CUDA GPU visible: calibrate --ops measures a GPU's kernels",
                fix="run it on the GPU machine, or pass --cpu (labelled; checks the path only)",
            )
        device = "cuda"
    cuda = device == "cuda"
    dev = torch.device("cuda" if cuda else "cpu")
    say = on_progress or (lambda _m: None)
    timer = _Timer(torch, cuda, cfg.reps)
    budget = cfg.budget_MiB * 2**20
    scale = 1.0 if cuda else 1 / 64  # toy sizes on a CPU
    shapes = _shapes(cfg.models, cfg.tp)
    res = OpsResult(
        device=device,
        device_name=torch.cuda.get_device_name(dev) if cuda else "CPU",
        torch_version=torch.__version__,
        models=cfg.models,
        tp=cfg.tp,
    )
    if not cuda:
        res.notes.append("CPU run (--cpu): toy sizes, eager; checks the path, not a GPU profile")
    torch.manual_seed(0)

    def timed(step: Callable[[], None], copies: int) -> float:
        fn = _graphed(torch, step) if cuda else step
        return timer(fn) / copies * 1e6

    def dim(x: int) -> int:
        return max(16, int(x * scale) // 16 * 16)

    say("GEMM bf16")
    for n, k in shapes["gemm"]:
        n, k = dim(n), dim(k)
        nbytes = n * k * 2
        copies = _copies(nbytes, budget * scale)
        ws = [torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.02 for _ in range(copies)]
        for b in cfg.batches:
            x = torch.randn(b, k, dtype=torch.bfloat16, device=dev)

            def step(ws=ws, x=x) -> None:
                for w in ws:
                    torch.nn.functional.linear(x, w)

            res.points.append(
                OpPoint(
                    family="gemm_bf16",
                    label=f"{n}x{k}",
                    batch=b,
                    nbytes=nbytes,
                    us=round(timed(step, copies), 3),
                )
            )
        del ws
    if cuda:
        say("GEMM fp8")
        try:
            _fp8(torch, dev, shapes, cfg, budget, res, timed)
        except (RuntimeError, AttributeError, TypeError) as exc:
            res.skipped["gemm_fp8"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    else:
        res.skipped["gemm_fp8"] = "CPU run: no FP8 GEMM"
    say("MoE grouped GEMM")
    try:
        _moe(torch, dev, shapes, cfg, budget * scale, scale, res, timed)
    except (RuntimeError, AttributeError, TypeError) as exc:
        res.skipped["moe_bf16"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    say("attention decode")
    _attention(torch, dev, shapes, cfg, budget * scale, scale, res, timed)
    say("RMSNorm")
    for h in shapes["hidden"]:
        x = torch.randn(1, h, dtype=torch.bfloat16, device=dev)
        w = torch.ones(h, dtype=torch.bfloat16, device=dev)

        def norm(x=x, w=w) -> None:
            for _ in range(64):
                torch.nn.functional.rms_norm(x, (x.shape[-1],), w)

        res.points.append(
            OpPoint(
                family="elementwise",
                label=f"rmsnorm {h}",
                batch=1,
                nbytes=3 * h * 2,
                us=round(timed(norm, 64), 3),
            )
        )
    res.fits = fit_families(res.points)
    return res


def _fp8(torch, dev, shapes, cfg, budget, res, timed) -> None:
    if not hasattr(torch, "_scaled_mm"):
        raise AttributeError("this PyTorch has no torch._scaled_mm")
    one = torch.tensor(1.0, device=dev)
    for n, k in shapes["gemm"]:
        nbytes = n * k
        copies = _copies(nbytes, budget)
        ws = [
            (torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.02).to(torch.float8_e4m3fn)
            for _ in range(copies)
        ]
        for b in cfg.batches:
            m = max(16, math.ceil(b / 16) * 16)
            x = torch.randn(m, k, dtype=torch.bfloat16, device=dev).to(torch.float8_e4m3fn)

            def step(ws=ws, x=x) -> None:
                for w in ws:
                    torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

            res.points.append(
                OpPoint(
                    family="gemm_fp8",
                    label=f"{n}x{k}",
                    batch=b,
                    nbytes=nbytes,
                    us=round(timed(step, copies), 3),
                )
            )
        del ws


def _moe(torch, dev, shapes, cfg, budget, scale, res, timed) -> None:
    grouped = getattr(torch, "_grouped_mm", None)
    for experts, topk, hidden, inter in shapes["moe"]:
        h, i = max(16, int(hidden * scale) // 16 * 16), max(16, int(inter * scale) // 16 * 16)
        for b in cfg.batches:
            touched = max(1, round(experts * (1 - (1 - topk / experts) ** b)))
            nbytes = touched * 3 * h * i * 2
            copies = _copies(nbytes, budget, cap=16)
            sets = [
                (
                    torch.randn(touched, h, 2 * i, dtype=torch.bfloat16, device=dev) * 0.02,
                    torch.randn(touched, i, h, dtype=torch.bfloat16, device=dev) * 0.02,
                )
                for _ in range(copies)
            ]
            rows = max(b * topk, touched)
            x = torch.randn(rows, h, dtype=torch.bfloat16, device=dev)
            per = [rows // touched + (1 if j < rows % touched else 0) for j in range(touched)]
            offs = torch.tensor(list(_cumsum(per)), dtype=torch.int32, device=dev)

            def step(sets=sets, x=x, offs=offs, per=per) -> None:
                for w1, w2 in sets:
                    if grouped is not None and x.is_cuda:
                        y = grouped(x, w1, offs=offs)
                        a = y[:, : w1.shape[-1] // 2] * y[:, w1.shape[-1] // 2 :]
                        grouped(a, w2, offs=offs)
                    else:  # loop over the touched experts (CPU / no grouped GEMM)
                        start = 0
                        for j, cnt in enumerate(per):
                            y = x[start : start + cnt] @ w1[j]
                            (y[:, : y.shape[1] // 2] * y[:, y.shape[1] // 2 :]) @ w2[j]
                            start += cnt

            res.points.append(
                OpPoint(
                    family="moe_bf16",
                    label=f"E{experts} k{topk} {h}x{i}",
                    batch=b,
                    nbytes=nbytes,
                    us=round(timed(step, copies), 3),
                )
            )
            del sets


def _cumsum(xs: list[int]):
    total = 0
    for x in xs:
        total += x
        yield total


def _attention(torch, dev, shapes, cfg, budget, scale, res, timed) -> None:
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for heads, kv_heads, hd in shapes["gqa"]:
        for ctx in cfg.contexts:
            c = max(16, int(ctx * scale))
            for b in cfg.batches[:1]:
                nbytes = 2 * b * kv_heads * c * hd * 2
                copies = _copies(nbytes, budget, cap=32)
                kvs = [
                    (
                        torch.randn(b, kv_heads, c, hd, dtype=torch.bfloat16, device=dev),
                        torch.randn(b, kv_heads, c, hd, dtype=torch.bfloat16, device=dev),
                    )
                    for _ in range(copies)
                ]
                q = torch.randn(b, heads, 1, hd, dtype=torch.bfloat16, device=dev)

                def step(kvs=kvs, q=q, heads=heads, kv_heads=kv_heads) -> None:
                    for k, v in kvs:
                        if heads != kv_heads:
                            sdpa(q, k, v, enable_gqa=True)
                        else:
                            sdpa(q, k, v)

                res.points.append(
                    OpPoint(
                        family="attn_gqa",
                        label=f"{heads}/{kv_heads}x{hd} ctx{c}",
                        batch=b,
                        nbytes=nbytes,
                        us=round(timed(step, copies), 3),
                    )
                )
                del kvs
    for heads in shapes["mla"]:
        for ctx in cfg.contexts:
            c = max(16, int(ctx * scale))
            nbytes = c * 576 * 2
            copies = _copies(nbytes, budget, cap=32)
            caches = [
                torch.randn(1, c, 576, dtype=torch.bfloat16, device=dev) for _ in range(copies)
            ]
            q = torch.randn(1, heads, 576, dtype=torch.bfloat16, device=dev)

            def mla(caches=caches, q=q) -> None:
                for kv in caches:
                    s = torch.softmax(torch.bmm(q, kv.transpose(1, 2)).float(), -1).to(kv.dtype)
                    torch.bmm(s, kv[..., :512])

            res.points.append(
                OpPoint(
                    family="attn_mla",
                    label=f"{heads} heads ctx{c}",
                    batch=1,
                    nbytes=nbytes,
                    us=round(timed(mla, copies), 3),
                )
            )
            del caches


def fit_families(points: list[OpPoint]) -> list[OpFit]:
    """Per family, at batch 1: ``t = t0 + bytes / bw`` by least squares (t0 >= 0); a family
    whose time does not grow with bytes keeps only its fixed cost (median)."""
    out: list[OpFit] = []
    for fam in sorted({p.family for p in points}):
        pts = [(float(p.nbytes), p.us) for p in points if p.family == fam and p.batch == 1]
        if not pts:
            continue
        t0, bw = _line(pts)
        stand_in = fam in ("moe_bf16", "attn_mla")
        out.append(
            OpFit(
                family=fam,
                t0_us=round(t0, 3),
                bw_GBps=round(bw, 1),
                batch=1,
                points=pts,
                engine_kernel=not stand_in,
                note="calibrate --ops (PyTorch " + ("stand-in)" if stand_in else "kernel)"),
            )
        )
    return out


def _line(pts: list[tuple[float, float]]) -> tuple[float, float]:
    if len(pts) >= 2:
        mx = statistics.fmean(p[0] for p in pts)
        my = statistics.fmean(p[1] for p in pts)
        sxx = sum((p[0] - mx) ** 2 for p in pts)
        if sxx > 0:
            slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx
            if slope > 0:
                t0 = my - slope * mx
                if t0 >= 0:
                    return t0, 1e-3 / slope
                # a negative intercept: through the origin of the smallest point
                return 0.0, 1e-3 / (sum(p[1] / p[0] for p in pts) / len(pts))
    return statistics.median(p[1] for p in pts), 0.0


def to_profile_ops(res: OpsResult) -> HardwareProfile:
    cpu = res.device == "cpu"
    return HardwareProfile(
        machine=f"{res.host} ({res.device_name}), {res.created[:10]}"
        + (" - CPU measurement" if cpu else ""),
        created=res.created,
        device=res.device,
        gpu=None if cpu else catalog_gpu(res.device_name),
        gpu_name_raw=res.device_name,
        ops=res.fits,
        notes=[*res.notes, *(f"ops {k} not measured: {v}" for k, v in res.skipped.items())],
    )
