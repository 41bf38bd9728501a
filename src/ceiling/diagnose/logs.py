"""Engine start-up logs -> EngineFacts (what the engine actually did) + findings.

Grepping a start-up log for ``custom_ops``, ``fuse_norm_quant``, CUDA-graph and AOT-cache lines is
what the founding story did by hand. Each engine's log grammar is data in the engines layer
(``ceiling.engines.diagnosis_data``: ``claims_log``, ``parse_log``; the grammars in
``ceiling.engines.<engine>_log``, shared helpers in ``ceiling.engines.logparse``), apart from
the adapters, which find, probe and launch engines; this module removes ANSI colour and ``\r``
redraws, asks the engines' readings which one wrote the log, lets it fill the facts and derives
the findings.

Each fact keeps the log lines it came from in ``evidence`` so that findings can quote them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from ceiling.diagnose.facts import EngineFacts
from ceiling.diagnose.findings import FindingContext, context_for, derive_findings
from ceiling.engines.diagnosis_data import READINGS, EngineReading, reading
from ceiling.engines.logparse import MAX_MESSAGES, parse_config_repr
from ceiling.errors import CeilingError
from ceiling.inputs import read_text
from ceiling.redact import MASK, is_secret_name
from ceiling.spec.hardware import GpuHardware, load_gpu

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

__all__ = [
    "MAX_MESSAGES",
    "EngineFacts",
    "detect_engine",
    "inspect_log",
    "inspect_with_gpu",
    "parse_config_repr",
    "parse_lines",
]

# ---- entry points ------------------------------------------------------------------------


def _log_readers() -> list[EngineReading]:
    """The engines that have a start-up log grammar, in registration order."""
    return list(READINGS)


def detect_engine(lines: list[str]) -> str | None:
    """The engine whose markers the log shows (``vllm``, ``sglang``; None when none matches)."""
    for engine in sorted(_log_readers(), key=lambda e: e.claim_rank):
        if engine.claims_log(lines):
            return engine.name
    return None


def parse_lines(
    lines: list[str],
    engine: str | None = None,
    concurrency: int | None = None,
    context: FindingContext | None = None,
) -> EngineFacts:
    """Facts (and findings) from log lines; ANSI colour and carriage-return redraws removed."""
    clean = [_ANSI.sub("", p) for ln in lines for p in ln.rstrip("\n").split("\r")]
    engine = engine or detect_engine(clean)
    readers = _log_readers()
    reader = next((r for r in readers if r.name == engine), None)
    if reader is None:
        raise CeilingError(
            "cannot tell which engine wrote this log",
            fix="pass " + " or ".join(f"--engine {r.name}" for r in readers),
        )
    facts = EngineFacts(engine=engine)
    reader.parse_log(clean, facts)
    # an engine prints its arguments, keys included ('api_key': [...]): never repeat those
    facts.non_default_args = {
        k: (MASK if is_secret_name(k) else v) for k, v in facts.non_default_args.items()
    }
    facts.findings = derive_findings(
        facts, concurrency=concurrency, context=context, fixes=reader.finding_fixes
    )
    return facts


def inspect_log(
    path: str | Path,
    engine: str | None = None,
    concurrency: int | None = None,
    context: FindingContext | None = None,
    env: Mapping[str, str] | None = None,
) -> EngineFacts:
    """Parse an engine log file into EngineFacts with findings. ``env``: the launched variant's
    environment, of which only the engine's ``facts_env`` variables are read."""
    p = Path(path)
    text = read_text(p, "log file", fix="pass the path of an engine's text log (stdout/stderr)")
    lines = text.splitlines()
    if env and engine:
        known = reading(engine)
        facts_env = known.facts_env if known else ()
        lines = [f"ceiling: variant env {k}={env[k]}" for k in facts_env if k in env] + lines
    facts = parse_lines(lines, engine=engine, concurrency=concurrency, context=context)
    facts.source = str(p)
    if facts == EngineFacts(engine=facts.engine, source=facts.source, findings=facts.findings):
        raise CeilingError(
            f"no line of {p} reads as a {facts.engine} start-up log: nothing to report",
            fix="pass the engine's own log (its stdout/stderr from start-up on)",
        )
    return facts


def inspect_with_gpu(
    path: Path,
    engine: str | None = None,
    concurrency: int | None = None,
    gpu: str | None = None,
) -> EngineFacts:
    """``ceiling inspect``: the facts and findings of a log (``gpu``: the catalog GPU it ran on,
    whose compute capability and link the rules check their advice against)."""
    ctx = None
    if gpu:
        load_gpu(gpu)  # an unknown name is an error with its fix, not a silent "unknown"
        ctx = context_for(GpuHardware(name=gpu))
    return inspect_log(path, engine=engine, concurrency=concurrency, context=ctx)
