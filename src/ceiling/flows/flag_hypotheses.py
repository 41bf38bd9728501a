"""The flags people try first ("would ``--num-scheduler-steps`` help?"), asked of the installed
engine before anything loads: a flag it would refuse is answered "not in the installed engine"
with its reason, at no cost of a model load (the founding story lost 36 minutes to that one).
"""

from __future__ import annotations

from ceiling.engines import engine_names, get_engine
from ceiling.engines.variant import Arg, Variant
from ceiling.flows import preflight


def flag_checks(
    flags: list[str], variant: Variant | None, engine: str | None
) -> dict[str, str | None]:
    """For each flag: why the installed engine rejects it (None: accepted). With a variant,
    preflight of the variant plus the flag; else the engine adapter's removed-flag table."""
    out: dict[str, str | None] = {}
    if not flags:
        return out
    if variant is not None:
        for flag in flags:
            trial = variant.model_copy(deep=True)
            trial.args.append(Arg(flag=flag, values=["8"]))
            rep = preflight.run(trial)
            probs = [p for p in rep.errors if flag.lstrip("-") in (p.subject + p.message)]
            msg = probs[0].message if probs else None
            if msg and rep.engine_version and rep.engine_version not in msg:
                msg += f" (installed {rep.engine} {rep.engine_version})"
            out[flag] = msg
        return out
    if not engine or engine.lower() not in engine_names():
        return out
    removed = get_engine(engine).removed_flags()
    for flag in flags:
        info = removed.get(flag.lstrip("-"))
        if info:
            out[flag] = f"removed in {engine} {info.removed_in}: {info.reason}" + (
                f"; instead: {info.replacement}" if info.replacement else ""
            )
    return out
