"""``ceiling commbench``: allreduce latency at the message sizes decode uses.

One process per rank, started fresh for every (variant, world size) so that the variant's
``NCCL_*`` environment is what NCCL reads; NCCL on GPUs, gloo on CPUs (so it runs anywhere).
Each run gives an nccl-tests-style table (size, count, type, time, algbw, busbw), eager and
inside a CUDA graph, an alpha-beta fit per (variant, world size, graph or not), and, with a model,
the per-token collective cost: layers x 2 allreduces x latency at B x hidden x 2 bytes.
The fits become :class:`~ceiling.spec.profile.CollectiveFit` entries of a hardware profile.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field

from ceiling.choices import CommBackend, CommDtype
from ceiling.errors import CeilingError
from ceiling.probe.fit import (
    algbw_GBps,
    busbw_GBps,
    fit_alpha_beta,
    human_size,
    interp_latency,
)
from ceiling.probe.ranks import CommbenchFile, run_ranks
from ceiling.probe.topology import probe
from ceiling.spec._data import load_yaml
from ceiling.spec.model import load_model
from ceiling.spec.profile import CollectiveFit, HardwareProfile

SCHEMA_VERSION = 1
TORCH_FIX = (
    "install PyTorch: pip install 'ceiling[torch]' (CPU build, runs gloo), "
    "or a CUDA build of torch on a GPU machine"
)


def presets() -> CommbenchFile:
    """data/commbench.yaml: variants, groups, always-set environment, reference hidden sizes."""
    return load_yaml("commbench.yaml", schema=CommbenchFile)


def resolve_variants(names: list[str], custom: list[str]) -> list[tuple[str, dict[str, str]]]:
    """Preset or group names plus ``K=V,K=V`` custom settings -> [(name, env)]."""
    p = presets()
    out: list[tuple[str, dict[str, str]]] = []
    for name in names or ([] if custom else ["default"]):
        members = p.groups.get(name, [name])
        for m in members:
            if m not in p.variants:
                known = ", ".join([*p.variants, *p.groups])
                raise CeilingError(f"unknown commbench variant '{m}'", fix=f"use one of: {known}")
            if m not in [n for n, _ in out]:
                out.append((m, dict(p.variants[m])))
    for spec in custom:
        env = {}
        for part in spec.split(","):
            if "=" not in part:
                raise CeilingError(f"bad --env '{spec}'", fix="write KEY=VALUE[,KEY=VALUE]")
            k, v = part.split("=", 1)
            env[k.strip()] = v.strip()
        out.append((",".join(f"{k}={v}" for k, v in env.items()), env))
    return out


#: The largest message commbench sends (8 GiB): a bigger --sizes is a typo that would make
#: every rank allocate it before the first measurement.
MAX_SIZE_BYTES = 1 << 33


class CommbenchConfig(BaseModel):
    world_sizes: list[Annotated[int, Field(ge=2, le=4096)]] | None = Field(
        None, description="None: 2..N (N GPUs, or 2 on CPU); capped by check_config"
    )
    sizes: list[Annotated[int, Field(ge=1, le=MAX_SIZE_BYTES)]] = Field(
        default_factory=lambda: [1024 * 2**i for i in range(17)]
    )
    variants: list[str] = Field(default_factory=list)
    custom_env: list[str] = Field(default_factory=list)
    backend: CommBackend = "auto"
    dtype: CommDtype | None = None  # None: bfloat16 on nccl, float32 on gloo
    graph: bool = True
    graph_ops: int = 10
    warmup: int = 5
    reps: int = Field(5, ge=1, le=10_000)
    min_iters: int = 5
    max_iters: int = 200
    budget_s: float = Field(0.02, gt=0, le=60, allow_inf_nan=False)  # per repetition per size
    model: str | None = None
    batch: list[Annotated[int, Field(ge=1, le=1_000_000)]] = Field(default_factory=lambda: [1])
    timeout_s: float = Field(600, gt=0, le=7 * 86400, allow_inf_nan=False)
    python: str = Field(default_factory=lambda: sys.executable)


class CommRow(BaseModel):
    size_bytes: int
    count: int
    dtype: str
    iters: int
    time_us: float
    time_us_min: float
    algbw_GBps: float
    busbw_GBps: float
    graph_time_us: float | None = None
    graph_algbw_GBps: float | None = None
    graph_busbw_GBps: float | None = None
    correct: bool
    marks: list[str] = Field(default_factory=list)


class VariantRun(BaseModel):
    variant: str
    env: dict[str, str]
    world_size: int
    backend: str
    device_name: str | None = None
    torch_version: str | None = None
    nccl_version: str | None = None
    link: str | None = None
    env_seen: dict[str, str] = Field(
        default_factory=dict, description="NCCL_*/GLOO_*/multicast settings the ranks ran with"
    )
    rows: list[CommRow] = Field(default_factory=list)
    fits: list[CollectiveFit] = Field(default_factory=list)
    error: str | None = None


class TokenCost(BaseModel):
    variant: str
    world_size: int
    in_cuda_graph: bool
    batch: int
    message_bytes: int
    latency_us: float
    per_token_ms: float
    delta_vs_default_pct: float | None = None


class ModelCost(BaseModel):
    model: str
    hidden: int
    layers: int
    allreduces_per_token: int
    rows: list[TokenCost] = Field(default_factory=list)


class CommbenchResult(BaseModel):
    schema_version: int = SCHEMA_VERSION
    created: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    host: str = Field(default_factory=socket.gethostname)
    backend: str
    device: str
    torch_version: str | None = None
    nccl_version: str | None = None
    topology_links: list[str] = Field(default_factory=list)
    runs: list[VariantRun] = Field(default_factory=list)
    model_cost: ModelCost | None = None
    notes: list[str] = Field(default_factory=list)

    @property
    def all_correct(self) -> bool:
        return all(r.correct for run in self.runs for r in run.rows)


# --------------------------------------------------------------------------- model dimensions


def model_dims(name: str) -> tuple[str, int, int]:
    """(name, hidden, layers) of a catalog model or a config.json path / model directory."""
    spec = load_model(name)
    return spec.name, int(spec.hidden), int(spec.num_layers)


# --------------------------------------------------------------------------- running


def check_config(cfg: CommbenchConfig) -> None:
    """Every input checked in well under a second, before torch is imported or a rank starts:
    the variants resolve, the model is known, and no world size asks for more ranks than the
    box has cores (a rank is a process; GPU counts are checked once torch has said them)."""
    resolve_variants(cfg.variants, cfg.custom_env)
    if cfg.model:
        model_dims(cfg.model)
    cores = os.cpu_count() or 1
    too_big = [w for w in cfg.world_sizes or [] if w > max(cores, 2)]
    if too_big:
        raise CeilingError(
            f"--world-sizes {max(too_big)}: more ranks than this machine's {cores} cores "
            "(each rank is a process; a GPU rank needs a GPU too)",
            fix=f"use --world-sizes up to {max(cores, 2)}",
        )


def _torch_facts(python: str) -> tuple[bool, int]:
    """(cuda available, GPU count) in a child process: the parent never imports torch/CUDA."""
    code = (
        "import torch,json;"
        "print(json.dumps([torch.cuda.is_available(), torch.cuda.device_count()]))"
    )
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:
        raise CeilingError("importing torch took over 2 minutes", fix="check the install") from exc
    if proc.returncode != 0:
        if "No module named 'torch'" in proc.stderr:
            raise CeilingError("commbench needs PyTorch, which is not installed", fix=TORCH_FIX)
        raise CeilingError(f"torch failed to import: {proc.stderr.strip()[-300:]}", fix=TORCH_FIX)
    cuda, n = json.loads(proc.stdout.strip().splitlines()[-1])
    return bool(cuda), int(n)


def decode_marks(sizes_hidden: dict[str, int], batches: list[int]) -> dict[int, list[str]]:
    """Message bytes -> labels such as 'decode B=1 llama-3.1-70b' (bf16 activations)."""
    marks: dict[int, list[str]] = {}
    for label, hidden in sizes_hidden.items():
        for b in batches:
            marks.setdefault(b * hidden * 2, []).append(f"decode B={b} {label}")
    return marks


def run_commbench(
    cfg: CommbenchConfig,
    on_progress: Callable[[str, int, int], None] | None = None,
    on_run: Callable[[CommbenchResult], None] | None = None,
) -> CommbenchResult:
    """Run every (variant, world size); return the tables, fits and per-token costs.

    ``on_run`` sees the result so far after each (variant, world size), so that a caller can
    checkpoint it: a long sweep cut short by a time limit keeps what it measured.
    """
    check_config(cfg)
    cuda, n_gpus = _torch_facts(cfg.python)
    backend = cfg.backend
    if backend == "auto":
        backend = "nccl" if cuda and n_gpus >= 1 else "gloo"
    if backend == "nccl" and not cuda:
        raise CeilingError("NCCL needs CUDA GPUs and none are visible", fix="use --backend gloo")
    device = "cuda" if backend == "nccl" else "cpu"
    dtype = cfg.dtype or ("bfloat16" if device == "cuda" else "float32")
    world_sizes = cfg.world_sizes or (list(range(2, n_gpus + 1)) if device == "cuda" else [2])
    notes = []
    if device == "cuda":
        too_big = [w for w in world_sizes if w > n_gpus]
        if too_big:
            raise CeilingError(
                f"world size {max(too_big)} needs {max(too_big)} GPUs; {n_gpus} visible",
                fix=f"use --world-sizes up to {n_gpus}",
            )
        if not world_sizes:
            raise CeilingError(
                "one GPU: an allreduce needs at least 2 ranks",
                fix="run on a multi-GPU machine, or --world-sizes 1 to check the NCCL/graph path",
            )
    if 1 in world_sizes:
        notes.append("world size 1: no link is crossed; it measures call and launch overhead only")

    model = None
    sizes = set(cfg.sizes)
    ref = dict(presets().reference_hidden_sizes)
    if cfg.model:
        mname, hidden, layers = model_dims(cfg.model)
        model = ModelCost(
            model=mname, hidden=hidden, layers=layers, allreduces_per_token=2 * layers
        )
        ref[mname] = hidden
        sizes.update(b * hidden * 2 for b in cfg.batch)
    marks = decode_marks(ref, cfg.batch if cfg.model else [1])
    sizes.update(s for s in marks if cfg.sizes and min(cfg.sizes) <= s <= max(cfg.sizes))
    size_list = sorted(sizes)

    topo = probe()
    result = CommbenchResult(
        backend=backend, device=device, topology_links=topo.link_kinds, notes=notes
    )
    for vname, venv in resolve_variants(cfg.variants, cfg.custom_env):
        for ws in world_sizes:
            label = f"{vname} x{ws}"
            run = _run_variant(
                cfg, backend, device, dtype, size_list, ws, vname, venv, label, on_progress
            )
            run.link = topo.link_for(list(range(ws))) if device == "cuda" else None
            for r in run.rows:
                r.marks = marks.get(r.size_bytes, [])
            run.fits = _fits(run, backend)
            result.runs.append(run)
            if run.error is None and result.torch_version is None:
                result.torch_version, result.nccl_version = run.torch_version, run.nccl_version
            if model is not None:
                model.rows = _token_costs(result, model, cfg.batch)
                result.model_cost = model
            if on_run is not None:
                on_run(result)
    if model is not None:
        model.rows = _token_costs(result, model, cfg.batch)
        result.model_cost = model
    return result


def _run_variant(
    cfg: CommbenchConfig,
    backend: str,
    device: str,
    dtype: str,
    sizes: list[int],
    ws: int,
    vname: str,
    venv: dict[str, str],
    label: str,
    on_progress: Callable[[str, int, int], None] | None,
) -> VariantRun:
    run = VariantRun(variant=vname, env=dict(venv), world_size=ws, backend=backend)
    with tempfile.TemporaryDirectory(prefix="ceiling-commbench-") as tmp:
        spec = {
            "backend": backend,
            "device": device,
            "dtype": dtype,
            "sizes": sizes,
            "graph": cfg.graph,
            "graph_ops": cfg.graph_ops,
            "warmup": cfg.warmup,
            "reps": cfg.reps,
            "min_iters": cfg.min_iters,
            "max_iters": cfg.max_iters,
            "budget_s": cfg.budget_s,
            "timeout_s": cfg.timeout_s,
            "out": str(Path(tmp, "result.json")),
        }
        spec_path = Path(tmp, "spec.json")
        spec_path.write_text(json.dumps(spec))

        def on_line(line: str) -> None:
            if line.startswith("PROGRESS") and on_progress is not None:
                _, done, total, _size = line.split()
                on_progress(label, int(done), int(total))

        outcome = run_ranks(
            [cfg.python, "-m", "ceiling.probe.commbench_worker", str(spec_path)],
            ws,
            venv,
            cfg.timeout_s,
            on_line,
        )
        out = Path(str(spec["out"]))
        if outcome.ok and out.is_file():
            data = json.loads(out.read_text())
            run.device_name = data.get("device_name")
            run.env_seen = data.get("env_seen", {})
            run.torch_version, run.nccl_version = data.get("torch"), data.get("nccl")
            for row in data["rows"]:
                t, g = row["time_us"], row.get("graph_time_us")
                size = row["size_bytes"]
                run.rows.append(
                    CommRow(
                        **row,
                        algbw_GBps=algbw_GBps(size, t),
                        busbw_GBps=busbw_GBps(size, t, ws),
                        graph_algbw_GBps=None if g is None else algbw_GBps(size, g),
                        graph_busbw_GBps=None if g is None else busbw_GBps(size, g, ws),
                    )
                )
        else:
            run.error = f"{label}: {outcome.describe()}"
    return run


def _fits(run: VariantRun, backend: str) -> list[CollectiveFit]:
    if not run.rows:
        return []
    impl = "nccl" if backend == "nccl" else backend
    out = []
    for graph in (False, True):
        pts: list[tuple[int, float]] = []
        for r in run.rows:
            t = r.graph_time_us if graph else r.time_us
            if t is not None:
                pts.append((r.size_bytes, t))
        if not pts:
            continue
        alpha, beta = fit_alpha_beta(pts)
        out.append(
            CollectiveFit(
                link=run.link,
                implementation=impl,
                world_size=run.world_size,
                alpha_us=round(alpha, 3),
                beta_GBps=round(beta, 3) if beta != float("inf") else 1e9,
                in_cuda_graph=graph,
                env=run.env,
                points=[(b, round(t, 3)) for b, t in pts],
            )
        )
    return out


def _token_costs(result: CommbenchResult, model: ModelCost, batches: list[int]) -> list[TokenCost]:
    rows = []
    base: dict[tuple[int, bool, int], float] = {}
    for run in result.runs:
        for fit in run.fits:
            for b in batches:
                size = b * model.hidden * 2
                lat = interp_latency(fit.points, size)
                ms = model.allreduces_per_token * lat / 1e3
                key = (run.world_size, fit.in_cuda_graph, b)
                if run.variant == "default":
                    base[key] = ms
                rows.append(
                    TokenCost(
                        variant=run.variant,
                        world_size=run.world_size,
                        in_cuda_graph=fit.in_cuda_graph,
                        batch=b,
                        message_bytes=size,
                        latency_us=round(lat, 3),
                        per_token_ms=round(ms, 4),
                    )
                )
    for r in rows:
        b0 = base.get((r.world_size, r.in_cuda_graph, r.batch))
        if b0:
            r.delta_vs_default_pct = round(100 * (r.per_token_ms - b0) / b0, 2)
    return rows


# --------------------------------------------------------------------------- outputs


def to_profile(result: CommbenchResult, machine: str | None = None) -> HardwareProfile:
    """The collective part of a hardware profile (merge it with calibrate's).

    World-size-1 runs are left out: they cross no link, and predict would otherwise rescale
    them to larger world sizes as if they were a link's measurement.
    """
    name = next((r.device_name for r in result.runs if r.device_name), None)
    notes = [f"commbench {result.backend} on {result.device}", *result.notes]
    if any(r.world_size < 2 for r in result.runs):
        notes.append("world size 1 runs are in the results file only, not in this profile")
    return HardwareProfile(
        machine=machine or f"{result.host} ({name or result.device}), {result.created[:10]}",
        created=result.created,
        gpu_name_raw=name if result.device == "cuda" else None,
        collectives=[f for run in result.runs if run.world_size >= 2 for f in run.fits],
        notes=notes,
    )


def table(run: VariantRun) -> tuple[list[str], list[list[str]]]:
    """nccl-tests-style header and rows (graph columns only when measured)."""
    graph = any(r.graph_time_us is not None for r in run.rows)
    header = ["size", "count", "type", "time us", "algbw GB/s", "busbw GB/s"]
    if graph:
        header += ["graph us", "graph busbw"]
    header += ["check", "decode message of"]
    rows = []
    for r in run.rows:
        row = [
            human_size(r.size_bytes),
            str(r.count),
            r.dtype,
            f"{r.time_us:.2f}",
            f"{r.algbw_GBps:.2f}",
            f"{r.busbw_GBps:.2f}",
        ]
        if graph:
            row += [
                "-" if r.graph_time_us is None else f"{r.graph_time_us:.2f}",
                "-" if r.graph_busbw_GBps is None else f"{r.graph_busbw_GBps:.2f}",
            ]
        row += [
            "ok" if r.correct else "WRONG",
            ", ".join(m.removeprefix("decode ") for m in r.marks),
        ]
        rows.append(row)
    return header, rows
