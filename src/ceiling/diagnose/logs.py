"""Engine start-up logs -> EngineFacts (what the engine actually did) + findings.

Grepping a start-up log for ``custom_ops``, ``fuse_norm_quant``, CUDA-graph and AOT-cache lines is
what the founding story did by hand. Each engine's log grammar lives in its adapter
(``ceiling.engines.<engine>``: ``claims_log``, ``parse_log``; shared helpers in
``ceiling.engines.logparse``); this module removes ANSI colour and ``\r`` redraws, asks the
adapters which one wrote the log, lets it fill the facts and derives the findings.

Each fact keeps the log lines it came from in ``evidence`` so that findings can quote them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from ceiling.console import emit_json, out
from ceiling.diagnose.facts import EngineFacts
from ceiling.diagnose.findings import FindingContext, context_for, derive_findings
from ceiling.engines import all_engines
from ceiling.engines.logparse import MAX_MESSAGES, parse_config_repr
from ceiling.errors import CeilingError
from ceiling.inputs import read_text
from ceiling.redact import MASK, is_secret_name
from ceiling.spec.hardware import GpuHardware, load_gpu

if TYPE_CHECKING:
    from ceiling.engines.base import Engine

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

__all__ = [
    "MAX_MESSAGES",
    "EngineFacts",
    "detect_engine",
    "inspect_log",
    "parse_config_repr",
    "parse_lines",
    "run_inspect",
]

# ---- entry points ------------------------------------------------------------------------


def _log_readers() -> list[Engine]:
    """The adapters that have a start-up log grammar, in registration order."""
    return [e for e in all_engines() if e.reads_logs()]


def detect_engine(lines: list[str]) -> str | None:
    """The engine whose markers the log shows (``vllm``, ``sglang``; None when none matches)."""
    for engine in sorted(_log_readers(), key=lambda e: e.log_claim_rank):
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
) -> EngineFacts:
    """Parse an engine log file into EngineFacts with findings."""
    p = Path(path)
    text = read_text(p, "log file", fix="pass the path of an engine's text log (stdout/stderr)")
    facts = parse_lines(text.splitlines(), engine=engine, concurrency=concurrency, context=context)
    facts.source = str(p)
    if facts == EngineFacts(engine=facts.engine, source=facts.source, findings=facts.findings):
        raise CeilingError(
            f"no line of {p} reads as a {facts.engine} start-up log: nothing to report",
            fix="pass the engine's own log (its stdout/stderr from start-up on)",
        )
    return facts


def run_inspect(
    path: Path,
    engine: str | None = None,
    concurrency: int | None = None,
    gpu: str | None = None,
    json_out: bool = False,
) -> int:
    """``ceiling inspect``: print the facts and findings (``gpu``: the catalog GPU it ran on)."""
    ctx = None
    if gpu:
        load_gpu(gpu)  # an unknown name is an error with its fix, not a silent "unknown"
        ctx = context_for(GpuHardware(name=gpu))
    facts = inspect_log(path, engine=engine, concurrency=concurrency, context=ctx)
    if json_out:
        emit_json(facts)
        return 0
    o = out()
    skip = {"findings", "evidence", "warnings", "errors", "non_default_args", "schema_version"}
    for key, value in facts.model_dump().items():
        if key in skip or value in (None, [], {}):
            continue
        o.print(f"{key:>32}: {escape(str(value))}", soft_wrap=True)
    if facts.non_default_args:
        o.print(f"{'non_default_args':>32}: {escape(str(facts.non_default_args))}", soft_wrap=True)
    o.print(f"{'warnings/errors':>32}: {len(facts.warnings)} / {len(facts.errors)}")
    for f in facts.findings:
        colour = {"critical": "red", "warning": "yellow"}.get(f.severity, "cyan")
        o.print(f"[{colour}]{f.severity}[/{colour}] {escape(f.title)} ({f.kind})")
        for line in f.evidence[:3]:
            o.print(f"    | {escape(line)}", soft_wrap=True)
        if f.fix:
            o.print(f"    fix: {escape(f.fix)}", soft_wrap=True)
        elif f.withheld:
            o.print(f"    {escape(f.withheld)}", soft_wrap=True)
        if f.doc:
            o.print(f"    why and what to do: {f.doc}", soft_wrap=True)
    return 0
