"""``ceiling calibrate --engine llamacpp``: llama.cpp's own mat-vec kernels measured on this GPU.

Runs ``test-backend-ops perf`` (a subprocess) or reads its recorded SQL output and writes the
profile ``predict --engine llamacpp`` reads: one ``--profile`` format for every engine, these
kernels its ``engine.llamacpp`` entry (:class:`~ceiling.predict.llamacpp.LlamaCppProfile`).
Apart from the predictor (``predict.llamacpp``) because it starts a process and writes a file: the
predictor stays pure, so the doctor's nouns may import it (tests/test_import_contract.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ceiling.errors import CeilingError
from ceiling.inputs import read_text
from ceiling.predict.gguf import read_gguf
from ceiling.predict.llamacpp import LlamaCppProfile, as_profile, profile_from_sql, weights_read
from ceiling.spec.profile import load_profile, save_profile

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


def calibrate_cli(
    binary: str | None,
    recorded: str | None,
    gguf: str | None,
    out: str | None,
    merge: str | None = None,
) -> LlamaCppProfile:
    """``ceiling calibrate --engine llamacpp``: run test-backend-ops (or read its recorded SQL
    output) for the weight types of ``gguf`` (default: F16, Q8_0, Q6_K, Q5_K, Q4_K, IQ4_XS)."""
    types = ["F16", "Q8_0", "Q6_K", "Q5_K", "Q4_K", "IQ4_XS"]
    if gguf:
        types = sorted({t.type for t, _ in weights_read(read_gguf(gguf))} - {"F32"}) or types
    if recorded:
        p = Path(recorded)
        text = read_text(p, "--from-output", fix="pass the SQL file of `test-backend-ops perf`")
        prof = profile_from_sql(text, source=str(p))
    elif binary:
        prof = profile_from_sql(run_backend_ops(binary, types), source=f"{binary} perf")
    else:
        raise CeilingError(
            "calibrate --engine llamacpp needs llama.cpp's test-backend-ops",
            fix=f"pass --test-backend-ops PATH ({BUILD}), or "
            "--from-output FILE with a recorded `--output sql` run",
        )
    if out:
        # one profile format: into an existing profile (calibrate's, commbench's) as its entry
        base = load_profile(merge) if merge else None
        save_profile(base.merge(as_profile(prof)) if base else as_profile(prof), out)
    return prof
