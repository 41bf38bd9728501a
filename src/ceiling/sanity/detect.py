"""Degenerate-output detectors: what a model computing the wrong thing does under greedy decoding.

Each detector looks at one generated answer and returns a :class:`Signal` (``suspect`` or
``broken``, with the evidence) or None. They are judged on token ids where the server returns
them, else on whitespace-separated words.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Literal

from pydantic import BaseModel

from ceiling.sanity.spec import DegenerateRules

REPLACEMENT = "\ufffd"


class Signal(BaseModel):
    detector: str
    status: Literal["suspect", "broken"]
    evidence: str


def _units(text: str, token_ids: list[int] | None) -> list[str]:
    if token_ids:
        return [str(t) for t in token_ids]
    return text.split()


def _show(text: str, limit: int = 80) -> str:
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return repr(text)


def empty_output(text: str, completion_tokens: int | None) -> Signal | None:
    """Tokens were generated but no visible text came back (empty or whitespace only)."""
    if text.strip() or completion_tokens == 0:
        return None
    n = f"{completion_tokens} tokens" if completion_tokens else "tokens"
    return Signal(
        detector="empty output",
        status="broken",
        evidence=f"{n} generated, text {_show(text)}: nothing but whitespace",
    )


def same_token_run(text: str, token_ids: list[int] | None, rules: DegenerateRules) -> Signal | None:
    """One token (or word) repeated ``same_token_run`` times in a row: 'one token forever'."""
    units = _units(text, token_ids)
    best, run, best_unit = 1, 1, units[0] if units else ""
    for prev, cur in pairwise(units):
        run = run + 1 if cur == prev else 1
        if run > best:
            best, best_unit = run, cur
    if best < rules.same_token_run:
        return None
    what = f"token id {best_unit}" if token_ids else f"word {best_unit!r}"
    return Signal(
        detector="one token forever",
        status="broken",
        evidence=f"{what} {best} times in a row in {_show(text)}",
    )


def short_loop(text: str, token_ids: list[int] | None, rules: DegenerateRules) -> Signal | None:
    """A cycle of 2..``loop_max_period`` units that covers most of a long enough answer.

    Greedy decoding of a healthy model can repeat a whole sentence; a two- to four-token cycle
    over most of the answer is what a model that lost its context does.
    """
    units = _units(text, token_ids)
    n = len(units)
    if n < rules.loop_min_tokens:
        return None
    for period in range(2, rules.loop_max_period + 1):
        # the longest stretch where unit[i] == unit[i - period], and where it ends
        best = cur = end = 0
        for i in range(period, n):
            cur = cur + 1 if units[i] == units[i - period] else 0
            if cur > best:
                best, end = cur, i + 1
        covered = best + period
        cycle = units[end - covered : end]
        if len(set(cycle)) > 1 and covered >= rules.loop_min_share * n:
            return Signal(
                detector="repetition loop",
                status="suspect",
                evidence=f"a {period}-token cycle covers {covered} of {n} tokens: {_show(text)}",
            )
    return None


def replacement_chars(text: str, rules: DegenerateRules) -> Signal | None:
    """U+FFFD: bytes that are not valid UTF-8 (the last 2 characters are exempt: a token budget
    can end inside a multi-byte character)."""
    count = text[:-2].count(REPLACEMENT) if len(text) > 2 else 0
    if not count:
        return None
    return Signal(
        detector="replacement characters",
        status="broken" if count >= rules.replacement_chars_broken else "suspect",
        evidence=f"{count} U+FFFD replacement characters (invalid UTF-8) in {_show(text)}",
    )


def scan(
    text: str, token_ids: list[int] | None, completion_tokens: int | None, rules: DegenerateRules
) -> list[Signal]:
    """Every detector's signal for one answer."""
    found = [
        empty_output(text, completion_tokens),
        same_token_run(text, token_ids, rules),
        replacement_chars(text, rules),
    ]
    if not any(found[:2]):
        found.append(short_loop(text, token_ids, rules))
    return [s for s in found if s is not None]


def length_signal(
    asked: int, got: int | None, finish_reason: str | None, text: str
) -> Signal | None:
    """Asked for exactly ``asked`` tokens (end-of-sequence ignored): the answer must say
    ``finish_reason: length`` with that many tokens. A model that emits its end token (or a
    server that stops) at once under ``ignore_eos`` is not generating."""
    if finish_reason == "length" and (got is None or got == asked):
        return None
    return Signal(
        detector="finish reason",
        status="suspect" if got and got >= asked // 2 else "broken",
        evidence=(
            f"asked for {asked} tokens with end-of-sequence ignored, got {got} tokens and "
            f"finish_reason {finish_reason!r}: {_show(text)}"
        ),
    )
