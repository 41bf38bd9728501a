"""Reading a start-up log: one driver (``read_log``), each engine's grammar as data.

An adapter declares its ``LogGrammar``: how a line reads (a regex with ``msg`` and optionally
``level`` and ``ts`` groups), which lines are warnings and errors, and its ``Rule`` list: a
pattern and what a matching line says (the fact its group sets, the evidence key it is quoted
under, or a small function for what does not fit). The driver owns the rest, the same for every
engine: the loop, the capped and de-duplicated warnings, the timestamps (start-up time from the
first line to the ready line), and the dispatch of every line to every rule.

Helpers for the values engines print: numbers with thousands separators, ``k=v,
k2=Config(a=1, b=[2, 3])`` argument lists, configs printed as JSON or as a Python repr with
enums, and evidence lines shortened around a needle. The facts are
:class:`ceiling.engines.facts.EngineFacts`.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ceiling.engines.facts import EngineFacts

#: warnings / errors kept per log, at most
MAX_MESSAGES = 40
#: a number as engines print it (``1,234`` or ``12.5``), as a regex group
NUM = r"([\d,]+(?:\.\d+)?)"


def num(text: str) -> float:
    return float(text.replace(",", ""))


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets and quotes (for ``k=v, k2=Config(a=1, b=[2, 3])``)."""
    parts, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if cur:
        parts.append("".join(cur).strip())
    return parts


def kv_pairs(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in split_top(text):
        key, eq, value = part.partition("=")
        if eq and re.fullmatch(r"[A-Za-z_][\w.]*", key.strip()):
            out[key.strip()] = value.strip()
    return out


def balanced(text: str, start: int) -> str:
    """The bracketed expression that opens at ``text[start]``."""
    open_ch = text[start]
    close_ch = {"{": "}", "(": ")", "[": "]"}[open_ch]
    depth, quote = 0, ""
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch == open_ch:
            depth += 1
        elif ch == close_ch:
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return text[start:]


_ENUM_REPR = re.compile(r"<(\w+)\.(\w+): [^>]*>")


def parse_config_repr(text: str) -> Any:
    """A config printed as JSON (vLLM <= 0.10) or as a Python repr with enums (>= 0.11)."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    cleaned = _ENUM_REPR.sub(lambda m: repr(m.group(2)), text)
    cleaned = re.sub(
        r"(?<![\w.'\"])([A-Za-z_]\w*)\.([A-Za-z_]\w*)(?=[,}\]])",
        lambda m: repr(m.group(2)),
        cleaned,
    )
    try:
        return ast.literal_eval(cleaned)
    except (ValueError, SyntaxError):
        pass
    # an object's repr inside the dict (0.25's ``'profiler_config': ProfilerConfig(...)``) is
    # valid syntax but no literal: such values are kept as their source text, the rest as values
    try:
        tree = ast.parse(cleaned.strip(), mode="eval")
    except SyntaxError:
        return None
    return _repr_value(tree.body, cleaned.strip())


def _repr_value(node: ast.expr, src: str) -> Any:
    if isinstance(node, ast.Dict):
        return {
            _repr_value(k, src): _repr_value(v, src)
            for k, v in zip(node.keys, node.values, strict=True)
            if k is not None
        }
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [_repr_value(e, src) for e in node.elts]
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.get_source_segment(src, node)


def unquote(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def as_int(value: str | None) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def as_bool(value: str | None) -> bool | None:
    if value is None:
        return None
    return {"True": True, "False": False, "true": True, "false": False}.get(value.strip())


def literal(value: str) -> Any:
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def shorten(line: str, needle: str, width: int = 160) -> str:
    """The part of a very long config line around ``needle`` (evidence stays readable)."""
    if len(line) <= width * 2:
        return line
    idx = line.find(needle)
    if idx < 0:
        return line[:width] + " ..."
    start = max(0, idx - 40)
    return ("... " if start else "") + line[start : idx + width] + " ..."


# ---- the driver --------------------------------------------------------------------------


@dataclass
class LogRead:
    """What a rule's function sees: the facts, the line (as quoted in evidence) and the
    grammar's scratch space for facts that need the whole log (a sum, a list of devices)."""

    facts: EngineFacts
    line: str
    scratch: dict[str, Any] = field(default_factory=dict)

    def quote(self, key: str, line: str | None = None) -> None:
        self.facts.add_evidence(key, self.line if line is None else line)


Apply = Callable[[re.Match[str], LogRead], None]


def _first_group(hit: re.Match[str]) -> str:
    return next((g for g in hit.groups() if g is not None), hit.group(0))


@dataclass(frozen=True)
class Rule:
    """One kind of log line and what it says.

    ``field`` is set from the first group that matched (through ``convert``), or to ``value``;
    with ``first_only`` only while it is still empty. ``apply`` does what does not fit that.
    The line is quoted under ``evidence`` (after both).
    """

    pattern: re.Pattern[str]
    field: str | None = None
    convert: Callable[[str], Any] = str
    value: Any = None
    first_only: bool = False
    apply: Apply | None = None
    evidence: str | None = None

    def read(self, hit: re.Match[str], r: LogRead) -> None:
        if self.field is not None and not (self.first_only and getattr(r.facts, self.field)):
            value = self.value if self.value is not None else self.convert(_first_group(hit))
            setattr(r.facts, self.field, value)
        if self.apply is not None:
            self.apply(hit, r)
        if self.evidence is not None:
            r.quote(self.evidence)


@dataclass(frozen=True)
class LogGrammar:
    """How one engine's start-up log reads (see the module docstring)."""

    rules: Sequence[Rule]
    #: a line's shape: ``msg`` (what the rules read), ``level`` and ``ts`` when it has them;
    #: a line that does not match is read whole
    line: re.Pattern[str] | None = None
    #: removed from every line first (a time/level prefix the rules do not want)
    prefix: re.Pattern[str] | None = None
    #: lines are stripped and blank ones skipped
    strip: bool = False
    #: a ``level`` group's value -> "warning" | "error" (lines with a level are judged by it)
    levels: Mapping[str, str] = field(default_factory=dict)
    #: lines without a level: errors, then warnings, by these patterns
    error: re.Pattern[str] | None = None
    warning: re.Pattern[str] | None = None
    #: the ``ts`` group -> seconds (None: unreadable); ``day_clock``: the time of day only
    timestamp: Callable[[str], float | None] | None = None
    day_clock: bool = False
    #: after the last line (facts that need the whole log, from ``LogRead.scratch``)
    finish: Callable[[LogRead], None] | None = None

    def prepare(self, raw: str) -> str:
        text = raw.strip() if self.strip else raw
        if self.prefix is not None:
            text = self.prefix.sub("", text)
        return text.strip() if self.strip else text

    def classify(self, m: re.Match[str] | None, text: str) -> str | None:
        """ "warning", "error" or None for one line."""
        if m is not None and self.line is not None and "level" in self.line.groupindex:
            return self.levels.get(m.group("level") or "")
        if self.error is not None and self.error.search(text):
            return "error"
        if self.warning is not None and self.warning.search(text):
            return "warning"
        return None


def read_log(grammar: LogGrammar, lines: list[str], facts: EngineFacts) -> None:
    """Fill ``facts`` from start-up log ``lines`` (ANSI colour and ``\\r`` removed)."""
    scratch: dict[str, Any] = {}
    first: float | None = None
    last: float | None = None
    has_ts = grammar.line is not None and "ts" in grammar.line.groupindex
    for raw in lines:
        text = grammar.prepare(raw)
        if grammar.strip and not text:
            continue
        m = grammar.line.match(text) if grammar.line is not None else None
        msg = m.group("msg") if m else text
        if m and has_ts and grammar.timestamp is not None:
            t = grammar.timestamp(m.group("ts"))
            if t is not None:
                first = t if first is None else first
                last = t if not facts.ready else last
        kind = grammar.classify(m, text)
        if kind == "warning" and len(facts.warnings) < MAX_MESSAGES:
            if msg.strip() not in facts.warnings:
                facts.warnings.append(msg.strip())
        elif kind == "error" and len(facts.errors) < MAX_MESSAGES:
            facts.errors.append(msg.strip())
        read = LogRead(facts, text.strip(), scratch)
        for rule in grammar.rules:
            hit = rule.pattern.search(msg)
            if hit:
                rule.read(hit, read)
    if grammar.finish is not None:
        grammar.finish(LogRead(facts, "", scratch))
    if first is not None and last is not None and facts.ready:
        span = last - first
        facts.startup_s = float(span % 86400 if grammar.day_clock else span)
