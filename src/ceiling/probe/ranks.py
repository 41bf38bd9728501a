"""Start one fresh process per rank (torch.distributed's env:// rendezvous) and wait for them.

Fresh processes per run are the point: NCCL reads its ``NCCL_*`` environment once, at
communicator creation, so a variant can only be tried in new processes. Every process gets the
always-on safety settings (NVLink multicast off) whatever the caller's environment says.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path


@cache
def always_env() -> dict[str, str]:
    """NVLink multicast off in every process we start (data/commbench.yaml, device README)."""
    import yaml

    path = Path(__file__).resolve().parents[1] / "data" / "commbench.yaml"
    return {k: str(v) for k, v in yaml.safe_load(path.read_text())["always_env"].items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RanksOutcome:
    codes: list[int | None]
    timed_out: bool
    log_tail: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(c == 0 for c in self.codes)

    def describe(self) -> str:
        why = "timed out" if self.timed_out else f"exit codes {self.codes}"
        return f"ranks failed ({why}): " + " | ".join(self.log_tail[-8:])


def rank_env(rank: int, world: int, port: int, variant_env: dict[str, str]) -> dict[str, str]:
    """The environment of one rank: ours minus NCCL_*, plus the variant, the safety settings and
    the rendezvous variables; ``src/`` on PYTHONPATH so ``-m ceiling...`` works uninstalled."""
    src = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(variant_env)
    env.update(always_env())
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        PYTHONPATH=src + os.pathsep + env.get("PYTHONPATH", ""),
        PYTHONUNBUFFERED="1",
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_ranks(
    argv: list[str],
    world: int,
    variant_env: dict[str, str],
    timeout_s: float,
    on_line: Callable[[str], None] | None = None,
) -> RanksOutcome:
    """Run ``argv`` once per rank; rank 0's stdout lines go to ``on_line``; logs are kept
    in a temporary folder and their tails returned."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ceiling-ranks-") as tmp:
        procs, logs = [], []
        for rank in range(world):
            log = open(Path(tmp, f"rank{rank}.log"), "w+")  # noqa: SIM115 (closed below)
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    argv,
                    env=rank_env(rank, world, port, variant_env),
                    stdout=subprocess.PIPE if rank == 0 else log,
                    stderr=log,
                    text=True,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + timeout_s
        timed_out = False
        try:
            assert procs[0].stdout is not None
            for line in procs[0].stdout:
                if on_line is not None:
                    on_line(line.rstrip("\n"))
                if time.monotonic() > deadline:
                    timed_out = True
                    break
            for p in procs:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        tail: list[str] = []
        for rank, log in enumerate(logs):
            log.seek(0)
            tail += [f"rank{rank}: {ln.rstrip()}" for ln in log.readlines()[-6:] if ln.strip()]
            log.close()
    return RanksOutcome(codes=[p.returncode for p in procs], timed_out=timed_out, log_tail=tail)
