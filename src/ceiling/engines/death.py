"""Classify why an engine server died, from its log (rules in ``data/death_causes.yaml``), and,
for ``ceiling inspect``, what a log of a failed start says about it (:func:`start_failure`): the
cause, the lines that show it, and for flags the parser refused, what the engine's removed-flags
table says about them (removed when, why, what instead)."""

from __future__ import annotations

import re
from functools import cache

from pydantic import BaseModel, Field

from ceiling.engines.facts import StartFailure
from ceiling.engines.tables import DeathCausesFile, RemovedFlag
from ceiling.engines.variant import normalize_flag
from ceiling.spec._data import load_yaml

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
    for rule in load_yaml("death_causes.yaml", folder="engines/data", schema=DeathCausesFile).rules:
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


# what says the process ended, as opposed to a log cut while the engine was still starting
_FATAL = re.compile(r"error|exception|failed|abort|killed|fatal|Traceback", re.I)
# the flags a parser refused: vLLM's argparse ("error: unrecognized arguments: --a 1 --b"),
# llama-server's ("error: invalid argument: --a")
_REFUSED = re.compile(r"error: (?:unrecognized arguments|invalid argument): (.*)$")


def start_failure(
    lines: list[str], engine: str, removed: dict[str, RemovedFlag]
) -> StartFailure | None:
    """Why the start-up that wrote ``lines`` failed, when a death rule names it and the lines
    show an error (None: no known cause, or no sign the process ended)."""
    death = classify_death(lines, engine=engine)
    if death.cause.startswith("unknown") or not any(_FATAL.search(ln) for ln in death.evidence):
        return None
    failure = StartFailure(cause=death.cause, evidence=death.evidence, fix=death.fix)
    refused = [
        tok
        for ln in death.evidence
        if (m := _REFUSED.search(ln))
        for tok in m.group(1).split()
        if tok.startswith("-")
    ]
    notes, fixes = [], []
    for flag in refused:
        entry = removed.get(normalize_flag(flag))
        if entry is None:
            continue
        approx = " (approximately)" if entry.approximate else ""
        notes.append(f"{flag} was removed in {engine} {entry.removed_in}{approx}: {entry.reason}")
        repl = entry.replacement
        fixes.append(
            f"drop {flag}: {repl}"
            if repl and repl.startswith("nothing")
            else f"replace {flag} with {repl}"
            if repl
            else f"drop {flag}"
        )
    if notes:
        failure.removed_flags = notes
        failure.fix = "; ".join(fixes)
    return failure
