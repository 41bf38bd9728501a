"""``ceiling calibrate``: what this GPU achieves, not what its datasheet says.

Measures, with PyTorch on the device:
- read bandwidth (a reduction over a buffer far larger than L2) and copy bandwidth (read+write);
- weight-read bandwidth of decode-shaped GEMV / skinny GEMM (batch 1..64) for bf16 and the
  low-precision paths the installed PyTorch offers on this GPU (fp8 through ``torch._scaled_mm``,
  int8 through ``torch._int_mm``; each is skipped with its reason when unavailable), cycling
  through more weight bytes than fit in cache, replayed from a CUDA graph as engines decode;
- the cost per kernel launch, eager (host issue rate) and replayed from a CUDA graph.

The result becomes a :class:`~ceiling.spec.profile.HardwareProfile` that ``predict --profile``
uses in place of datasheet numbers. Without a GPU the command refuses, unless ``--cpu`` asks
for the same measurements on the CPU; such a profile says ``device: cpu`` everywhere.
"""

from __future__ import annotations

import math
import socket
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from ceiling.errors import CeilingError
from ceiling.probe.topology import catalog_gpu, cpu_info
from ceiling.spec._data import DataModel, load_yaml
from ceiling.spec.profile import HardwareProfile

SCHEMA_VERSION = 1
TORCH_FIX = "install PyTorch: pip install 'ceiling[torch]' (or a CUDA build on a GPU machine)"


class DeviceSettings(DataModel):
    """What calibrate measures on one kind of device (buffer sizes, batches, GEMV shapes)."""

    mem_GiB: float
    gemv_GiB: float
    batches: list[int]
    launch_kernels: int
    shapes: list[tuple[int, int]]  # [out, in]
    fit_MiB: int = Field(0, description="bytes per shape of the GEMV fit (with fit_shapes)")
    fit_shapes: list[tuple[int, int]] = Field(default_factory=list)


class CalibrateFile(DataModel):
    """``data/calibrate.yaml``."""

    schema_version: int
    gpu: DeviceSettings
    cpu: DeviceSettings


def settings() -> CalibrateFile:
    return load_yaml("calibrate.yaml", schema=CalibrateFile)


class CalibrateConfig(BaseModel):
    device: str = "auto"  # auto | cuda | cpu
    dtypes: list[str] | None = Field(None, description="None: bf16, fp8, int8 (bf16 on CPU)")
    batches: list[int] | None = None
    scale: float = Field(
        1.0, gt=0, le=1000, allow_inf_nan=False, description="multiplies the buffer sizes"
    )
    reps: int = Field(7, ge=1)


class GemvPoint(BaseModel):
    dtype: str
    batch: int
    padded_batch: int = Field(description="rows actually computed (fp8/int8 kernels need >=16/32)")
    weight_bytes: int
    time_us: float
    bw_GBps: float
    tflops: float


class GemvFit(BaseModel):
    """t_us = fixed_us + bytes / (bw_GBps * 1e3) for one GEMV kernel, fitted over shapes."""

    dtype: str
    batch: int
    fixed_us: float = Field(description="per-kernel cost that does not scale with bytes")
    bw_GBps: float = Field(description="asymptotic weight-read bandwidth (the slope)")
    points: list[tuple[int, float]] = Field(
        default_factory=list, description="(weight bytes of one GEMV, median us per GEMV)"
    )


class CalibrateResult(BaseModel):
    schema_version: int = SCHEMA_VERSION
    created: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    host: str = Field(default_factory=socket.gethostname)
    device: str
    device_name: str
    torch_version: str
    mem_read_GBps: float
    copy_GBps: float = Field(description="bytes read + bytes written per second")
    gemv: list[GemvPoint] = Field(default_factory=list)
    gemv_fit: GemvFit | None = None
    skipped: dict[str, str] = Field(default_factory=dict, description="dtype -> why not measured")
    launch_us_eager: float
    launch_us_graph: float | None = None
    notes: list[str] = Field(default_factory=list)

    def gemv_bw(self) -> dict[str, float]:
        """Per dtype: the bandwidth at the smallest measured batch (the decode number)."""
        out: dict[str, float] = {}
        for p in sorted(self.gemv, key=lambda p: p.batch):
            out.setdefault(p.dtype, p.bw_GBps)
        return out


def _import_torch() -> Any:
    try:
        import torch  # heavy and optional (the [torch] extra): only calibrate needs it
    except ImportError as exc:
        raise CeilingError(
            "calibrate needs PyTorch, which is not installed", fix=TORCH_FIX
        ) from exc
    return torch


class _Timer:
    """Median wall time of a callable on the device clock (events) or the host clock (CPU)."""

    def __init__(self, torch: Any, cuda: bool, reps: int) -> None:
        self.torch, self.cuda, self.reps = torch, cuda, reps

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def __call__(self, fn: Callable[[], Any], warmup: int = 2) -> float:
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(self.reps):
            if self.cuda:
                a = self.torch.cuda.Event(enable_timing=True)
                b = self.torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


def run_calibrate(
    cfg: CalibrateConfig, on_progress: Callable[[str], None] | None = None
) -> CalibrateResult:
    torch = _import_torch()
    cuda_ok = torch.cuda.is_available()
    device = cfg.device
    if device == "auto":
        if not cuda_ok:
            raise CeilingError(
                "no CUDA GPU visible: calibrate measures a GPU",
                fix="run it on the GPU machine, or pass --cpu for a CPU measurement "
                "(labelled as such; not a GPU profile)",
            )
        device = "cuda"
    if device == "cuda" and not cuda_ok:
        raise CeilingError("--device cuda but no CUDA GPU is visible", fix="use --cpu")
    cuda = device == "cuda"
    s = settings().gpu if cuda else settings().cpu
    dev = torch.device("cuda" if cuda else "cpu")
    timer = _Timer(torch, cuda, cfg.reps)
    say = on_progress or (lambda _m: None)
    torch.manual_seed(0)

    say("memory bandwidth")
    nbytes, t_read, t_copy = _bandwidth(torch, dev, timer, int(s.mem_GiB * cfg.scale * 2**30))

    result = CalibrateResult(
        device=device,
        device_name=torch.cuda.get_device_name(dev) if cuda else _cpu_name(),
        torch_version=torch.__version__,
        mem_read_GBps=round(nbytes / t_read / 1e9, 1),
        copy_GBps=round(2 * nbytes / t_copy / 1e9, 1),
        launch_us_eager=0.0,
    )
    if not cuda:
        result.notes.append("CPU measurement (--cpu): describes this CPU, not any GPU")

    batches = cfg.batches or s.batches
    for dtype in cfg.dtypes or (["bf16", "fp8", "int8"] if cuda else ["bf16"]):
        say(f"GEMV {dtype}")
        try:
            result.gemv += _gemv(torch, dev, cuda, timer, dtype, s, cfg.scale, batches)
        except _Skip as why:
            result.skipped[dtype] = str(why)
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            result.skipped[dtype] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        if cuda:
            torch.cuda.empty_cache()

    if cuda and s.fit_shapes and "bf16" not in result.skipped:
        say("GEMV per-kernel fit (bf16)")
        result.gemv_fit = _gemv_fit(torch, dev, timer, s)
        torch.cuda.empty_cache()

    say("launch overhead")
    result.launch_us_eager, result.launch_us_graph = _launch(torch, dev, cuda, s.launch_kernels)
    return result


def _bandwidth(torch: Any, dev: Any, timer: _Timer, nbytes: int) -> tuple[int, float, float]:
    """(bytes, seconds to read them once with a reduction, seconds to copy them)."""
    x = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=dev)
    y = torch.empty_like(x)
    t_read = timer(lambda: x.sum())
    t_copy = timer(lambda: y.copy_(x))
    return x.numel() * x.element_size(), t_read, t_copy


class _Skip(Exception):
    pass


def _gemv(
    torch: Any,
    dev: Any,
    cuda: bool,
    timer: _Timer,
    dtype: str,
    s: DeviceSettings,
    scale: float,
    batches: list[int],
) -> list[GemvPoint]:
    """Decode-shaped products over a weight set larger than cache, per batch size."""
    shapes = [tuple(x) for x in s.shapes]
    budget = s.gemv_GiB * scale * 2**30
    weights: list[tuple[int, int, Any]] = []
    total = 0
    elem = 2 if dtype == "bf16" else 1
    while total < budget:
        for n_out, k in shapes:
            if total >= budget:
                break
            w = torch.randn(n_out, k, dtype=torch.bfloat16, device=dev) * 0.02
            if dtype == "bf16":
                pass
            elif dtype == "fp8":
                if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
                    raise _Skip("this PyTorch has no torch._scaled_mm / float8_e4m3fn")
                w = w.to(torch.float8_e4m3fn)
            elif dtype == "int8":
                if not hasattr(torch, "_int_mm"):
                    raise _Skip("this PyTorch has no torch._int_mm")
                w = (w * 127 / 0.1).clamp(-127, 127).to(torch.int8)
            else:
                raise _Skip(f"unknown dtype {dtype}")
            weights.append((n_out, k, w))
            total += n_out * k * elem
    points = []
    for b in batches:
        pad = _padded(dtype, b)
        xs = {k: _activation(torch, dev, dtype, pad, k) for _, k, _ in weights}
        one = torch.tensor(1.0, device=dev)

        def step(xs=xs, one=one) -> None:
            for _n, k, w in weights:
                if dtype == "bf16":
                    torch.nn.functional.linear(xs[k], w)
                elif dtype == "fp8":
                    torch._scaled_mm(
                        xs[k], w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16
                    )
                else:
                    torch._int_mm(xs[k], w.t())

        step()  # raises here if the path is unsupported on this device
        fn = _graphed(torch, step) if cuda else step
        t = timer(fn)
        flops = sum(2 * pad * n * k for n, k, _ in weights)
        points.append(
            GemvPoint(
                dtype=dtype,
                batch=b,
                padded_batch=pad,
                weight_bytes=total,
                time_us=round(t * 1e6, 2),
                bw_GBps=round(total / t / 1e9, 1),
                tflops=round(flops / t / 1e12, 2),
            )
        )
    return points


def _gemv_fit(torch: Any, dev: Any, timer: _Timer, s: DeviceSettings) -> GemvFit:
    """Time each decode shape alone (bf16, batch 1, in a CUDA graph, over copies that exceed
    the L2) and fit a line: the intercept is the fixed cost of one GEMV kernel, the slope the
    asymptotic bandwidth. An aggregate bandwidth over a mix of shapes folds the fixed costs in;
    predict adds them per kernel, so it needs the two apart."""
    budget = s.fit_MiB * 2**20
    points: list[tuple[int, float]] = []
    for n_out, k in (tuple(x) for x in s.fit_shapes):
        nbytes = n_out * k * 2
        copies = max(8, int(budget // nbytes))
        ws = [torch.randn(n_out, k, dtype=torch.bfloat16, device=dev) * 0.02 for _ in range(copies)]
        x = torch.randn(1, k, dtype=torch.bfloat16, device=dev)

        def step(ws=ws, x=x) -> None:
            for w in ws:
                torch.nn.functional.linear(x, w)

        t = timer(_graphed(torch, step))
        points.append((nbytes, round(t / copies * 1e6, 3)))
        del ws
    fixed_us, bw = fit_line(points)
    return GemvFit(dtype="bf16", batch=1, fixed_us=fixed_us, bw_GBps=bw, points=points)


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares t_us = a + bytes * b over (bytes, us) points -> (a us, 1 / b in GB/s)."""
    n = len(points)
    if n < 2:
        raise ValueError("a line needs two points")
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    sxy = sum((p[0] - mx) * (p[1] - my) for p in points)
    slope = sxy / sxx  # us per byte
    if slope <= 0:
        raise ValueError("GEMV time does not grow with bytes: the measurement is broken")
    return round(my - slope * mx, 3), round(1 / slope / 1e3, 1)


def _padded(dtype: str, b: int) -> int:
    if dtype == "fp8":
        return max(16, math.ceil(b / 16) * 16)
    if dtype == "int8":
        return max(32, math.ceil(b / 8) * 8)
    return b


def _activation(torch: Any, dev: Any, dtype: str, m: int, k: int) -> Any:
    x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
    if dtype == "fp8":
        return x.to(torch.float8_e4m3fn)
    if dtype == "int8":
        return (x * 40).clamp(-127, 127).to(torch.int8)
    return x


def _graphed(torch: Any, step: Callable[[], None]) -> Callable[[], None]:
    """Capture ``step`` in a CUDA graph (after a side-stream warm-up) and return its replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    return g.replay


def _launch(torch: Any, dev: Any, cuda: bool, n: int) -> tuple[float, float | None]:
    """Per-kernel time of n tiny kernels: eager (host-bound issue) and graph replay."""
    t = torch.zeros(1, device=dev)
    for _ in range(50):
        t.add_(1.0)
    if cuda:
        torch.cuda.synchronize()
    eager = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            t.add_(1.0)
        if cuda:
            torch.cuda.synchronize()
        eager.append((time.perf_counter() - t0) / n * 1e6)
    if not cuda:
        return round(statistics.median(eager), 3), None

    def step() -> None:
        for _ in range(n):
            t.add_(1.0)

    replay = _graphed(torch, step)
    timer = _Timer(torch, True, 5)
    graph_s = timer(replay)
    return round(statistics.median(eager), 3), round(graph_s / n * 1e6, 3)


def _cpu_name() -> str:
    return f"CPU: {cpu_info().model or 'unknown'}"


def to_profile(result: CalibrateResult) -> HardwareProfile:
    """The calibrated part of a hardware profile."""
    cpu = result.device == "cpu"
    notes = list(result.notes)
    notes += [f"gemv {k} not measured: {v}" for k, v in result.skipped.items()]
    notes.append(
        f"calibrate: read {result.mem_read_GBps} GB/s, copy {result.copy_GBps} GB/s (r+w), "
        f"torch {result.torch_version}"
    )
    gemv_bw = result.gemv_bw()
    fit = result.gemv_fit
    if fit is not None:
        # predict charges each GEMM its fixed cost on top of bytes / bandwidth, so the
        # bandwidth it needs is the fitted slope, not the aggregate that folds fixed costs in
        gemv_bw[fit.dtype] = fit.bw_GBps
        notes.append(
            f"gemv {fit.dtype} batch {fit.batch}: {fit.fixed_us} us fixed + bytes / "
            f"{fit.bw_GBps} GB/s per kernel (fitted over {len(fit.points)} shapes)"
        )
    return HardwareProfile(
        machine=f"{result.host} ({result.device_name}), {result.created[:10]}"
        + (" - CPU measurement" if cpu else ""),
        created=result.created,
        device=result.device,
        gpu=None if cpu else catalog_gpu(result.device_name),
        gpu_name_raw=result.device_name,
        mem_bw_GBps=result.mem_read_GBps,
        copy_bw_GBps=result.copy_GBps,
        gemv_bw_GBps=gemv_bw,
        gemm_fixed_us_graph=fit.fixed_us if fit else None,
        kernel_launch_us_eager=result.launch_us_eager,
        kernel_launch_us_graph=result.launch_us_graph,
        notes=notes,
    )
