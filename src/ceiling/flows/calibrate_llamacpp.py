"""``ceiling calibrate --engine llamacpp``: llama.cpp's kernels timed on this GPU, into a profile.

The flow: the weight types of a GGUF (its header), ``test-backend-ops`` run
(``probe.llamacpp_calibrate``) or its recorded SQL read, the rates parsed by the predictor
(``predict.llamacpp.profile_from_sql``) and the profile written: one ``--profile`` format for
every engine, these kernels its ``engine.llamacpp`` entry
(:class:`~ceiling.predict.llamacpp.LlamaCppProfile`).
"""

from __future__ import annotations

from pathlib import Path

from ceiling.errors import CeilingError
from ceiling.inputs import read_text
from ceiling.predict.gguf import read_gguf
from ceiling.predict.llamacpp import LlamaCppProfile, as_profile, profile_from_sql, weights_read
from ceiling.probe.llamacpp_calibrate import BUILD, run_backend_ops
from ceiling.spec.profile import load_profile, save_profile


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
