"""llama.cpp's calibration runner: its own mat-vec kernels timed by ``test-backend-ops perf``.

The subprocess only: its SQL output is parsed by the predictor (``predict.llamacpp``
``profile_from_sql``) and the profile written by ``flows.calibrate_llamacpp`` (the body of
``ceiling calibrate --engine llamacpp``). Apart from the predictor because it starts a process:
the predictor stays pure, so the doctor's nouns may import it (tests/test_import_contract.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ceiling.errors import CeilingError

#: how to get the binary: llama.cpp's own build (a user's pip install has no build script of ours)
BUILD = "build llama.cpp with -DLLAMA_BUILD_TESTS=ON: bin/test-backend-ops"


def run_backend_ops(binary: str | Path, types: list[str], timeout_s: float = 300.0) -> str:
    """Run llama.cpp's ``test-backend-ops perf`` for the mat-vec of ``types`` (one token, its
    4096 x 14336 case: a matrix of 33-117 MB, past launch overhead) on the first CUDA device."""
    names = "|".join(t.lower().replace("_k", "_K") for t in types)
    argv = [
        str(binary),
        "perf",
        "-b",
        "CUDA0",
        "-o",
        "MUL_MAT",
        "--output",
        "sql",
        "-p",
        f"type_a=({names}),type_b=f32,m=4096,n=1,k=14336,",
    ]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CeilingError(
            f"test-backend-ops did not run: {exc}", fix=f"pass --test-backend-ops PATH ({BUILD})"
        ) from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CeilingError(f"test-backend-ops failed: {tail}", fix="check the CUDA device")
    return proc.stdout
