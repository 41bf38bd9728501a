"""Engine-neutral helpers for reading start-up logs (each engine's grammar lives in its adapter).

Numbers with thousands separators, ``k=v, k2=Config(a=1, b=[2, 3])`` argument lists, configs
printed as JSON or as a Python repr with enums, and evidence lines shortened around a needle.
The facts they fill are :class:`ceiling.diagnose.facts.EngineFacts`.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

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
        return None


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
