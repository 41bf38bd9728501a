"""One rank of ``ceiling commbench``: run as ``python -m ceiling.probe.commbench_worker SPEC``.

Started fresh for every (variant, world size) by :mod:`ceiling.probe.commbench`, so the NCCL_*
environment of the variant is what NCCL reads at initialisation. Imports only torch, the
standard library and :mod:`ceiling.probe.rankstage` (standard library only). Rank 0 prints
``PROGRESS done total`` lines on stdout and writes the result JSON to ``spec["out"]``.

Per message size: one allreduce checked against the exact expected sum (small integers, exact in
bf16), warm-up, an iteration count sized to a time budget (agreed by all ranks), then ``reps``
timed repetitions of that many back-to-back allreduces (CUDA events on GPU, perf_counter on CPU);
the median per-op time, max over ranks, is reported. On GPU the same is done by replaying a CUDA
graph that holds ``graph_ops`` allreduces, as engines run decode.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from ceiling.probe.rankstage import arm, stage


def main(spec_path: str) -> int:
    arm()  # a rank stopped for its time limit leaves its stacks in its log
    stage("import torch")
    import torch  # heavy and optional: imported once the rank is armed, its time is staged
    import torch.distributed as dist

    spec = json.loads(Path(spec_path).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    cuda = spec["device"] == "cuda"
    dev = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    kwargs: dict[str, Any] = {"device_id": dev} if cuda else {}
    stage("init_process_group")
    dist.init_process_group(
        spec["backend"],
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=spec.get("timeout_s", 300)),
        **kwargs,
    )
    dtype = getattr(torch, spec["dtype"])
    elem = torch.tensor([], dtype=dtype).element_size()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    def agree(value: float, op: Any) -> float:
        t = torch.tensor([value], dtype=torch.float64 if not cuda else torch.float32, device=dev)
        dist.all_reduce(t, op=op)
        return float(t.item())

    def timed(fn, n: int) -> float:
        """Seconds for n calls of fn, on the device clock when there is one."""
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(n):
                fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t0

    rows = []
    sizes = spec["sizes"]
    total = len(sizes)
    for k, size in enumerate(sizes):
        stage(f"size {size} eager")
        numel = max(1, size // elem)
        idx = torch.arange(numel, device=dev)
        x = ((idx + rank) % 5 - 2).to(dtype)
        dist.all_reduce(x)
        expected = torch.zeros_like(idx)
        for r in range(world):
            expected += (idx + r) % 5 - 2
        expected = expected.to(dtype)
        ok = bool(torch.equal(x, expected))
        correct = agree(1.0 if ok else 0.0, dist.ReduceOp.MIN) == 1.0
        del idx, expected

        def refill(x=x) -> None:
            # small random values: repeated in-place sums stay finite and not all-zero
            x.normal_().mul_(1e-20)

        def op(x=x) -> None:
            dist.all_reduce(x)

        refill()
        for _ in range(spec["warmup"]):
            op()
        sync()
        one = timed(op, 2) / 2
        one = agree(one, dist.ReduceOp.MAX)
        iters = int(
            min(spec["max_iters"], max(spec["min_iters"], spec["budget_s"] / max(one, 1e-7)))
        )
        per_op = []
        for _ in range(spec["reps"]):
            refill()
            sync()
            dist.barrier()
            per_op.append(timed(op, iters) / iters)
        med = agree(statistics.median(per_op), dist.ReduceOp.MAX)
        row = {
            "size_bytes": numel * elem,
            "count": numel,
            "dtype": spec["dtype"],
            "iters": iters,
            "time_us": med * 1e6,
            "time_us_min": agree(min(per_op), dist.ReduceOp.MAX) * 1e6,
            "graph_time_us": None,
            "correct": correct,
        }
        if cuda and spec["graph"]:
            stage(f"size {size} graph")
            row["graph_time_us"] = _graph_time(torch, dist, x, op, refill, spec, iters, agree, sync)
        rows.append(row)
        if rank == 0:
            print(f"PROGRESS {k + 1} {total} {size}", flush=True)
    if rank == 0:
        info = {
            "rows": rows,
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
            "world_size": world,
            "backend": spec["backend"],
            "device_name": torch.cuda.get_device_name(dev) if cuda else "cpu",
            "env_seen": {
                k: v
                for k, v in os.environ.items()
                if k.startswith(("NCCL_", "GLOO_", "TORCH_SYMM", "NVSHMEM_"))
            },
        }
        with open(spec["out"], "w") as f:
            json.dump(info, f)
    stage("final barrier")
    dist.barrier()
    dist.destroy_process_group()
    stage("done")
    return 0


def _graph_time(torch, dist, x, op, refill, spec, iters, agree, sync) -> float:
    """Median per-allreduce time when ``graph_ops`` allreduces are replayed from one CUDA graph."""
    g_ops = spec["graph_ops"]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            op()
    torch.cuda.current_stream().wait_stream(s)
    sync()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(g_ops):
            op()
    replays = max(1, iters // g_ops)
    for _ in range(3):
        graph.replay()
    per_op = []
    for _ in range(spec["reps"]):
        refill()
        sync()
        dist.barrier()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(replays):
            graph.replay()
        b.record()
        b.synchronize()
        per_op.append(a.elapsed_time(b) / 1e3 / (replays * g_ops))
    del graph
    return agree(statistics.median(per_op), dist.ReduceOp.MAX) * 1e6


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
