"""Classify why an engine server died, from its log (rules in ``data/death_causes.yaml``)."""

from __future__ import annotations

import re
from functools import cache

from pydantic import BaseModel, Field

from ceiling.engines.base import load_data
from ceiling.engines.tables import DeathCausesFile

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class DeathCause(BaseModel):
    """The classified cause of a death, the log lines that show it, and the fix to try."""

    cause: str
    exit_code: int | None = None
    evidence: list[str] = Field(default_factory=list)
    fix: str = ""


@cache
def _rules() -> list[tuple[str, re.Pattern[str], str, tuple[str, ...]]]:
    rules = []
    for rule in load_data("death_causes.yaml", DeathCausesFile).rules:
        rules.append((rule.cause, re.compile(rule.pattern), rule.fix, tuple(rule.engines)))
    return rules


def classify_death(
    lines: list[str], exit_code: int | None = None, engine: str | None = None, context: int = 1
) -> DeathCause:
    """The first matching rule's cause with up to 6 quoted lines; ``unknown`` with the tail."""
    clean = [_ANSI.sub("", ln.rstrip("\n")) for ln in lines]
    for cause, pattern, fix, engines in _rules():
        if engines and engine and engine not in engines:
            continue
        hits = [i for i, ln in enumerate(clean) if pattern.search(ln)]
        if not hits:
            continue
        evidence: list[str] = []
        for i in hits[:3]:
            for j in range(max(0, i - context), min(len(clean), i + context + 1)):
                if clean[j].strip() and clean[j] not in evidence:
                    evidence.append(clean[j])
        return DeathCause(cause=cause, exit_code=exit_code, evidence=evidence[:6], fix=fix)
    tail = [ln for ln in clean if ln.strip()][-5:]
    signal_note = ""
    if exit_code is not None and exit_code < 0:
        signal_note = f" (killed by signal {-exit_code})"
    return DeathCause(
        cause="unknown" + signal_note,
        exit_code=exit_code,
        evidence=tail,
        fix="read the log; if the process was killed by a signal, check memory (dmesg) and limits",
    )
