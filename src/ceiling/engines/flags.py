"""The flag nouns: one flag of an engine (``FlagSpec``), all of them (``FlagTable``), the kinds
of value a parser takes (``ValueType``), and what preflight says about a flag (``Problem``).

Which value types exist beyond ``int``/``float`` is the engines' knowledge: each adapter lists
its own parser's (``Engine.value_types``: vLLM's ``human_readable_int``, llama-cpp-python's word
booleans). ``parse_help_text`` reads argparse ``--help`` output when a parser cannot be imported.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field


class FlagSpec(BaseModel):
    """One flag the installed engine accepts (from its own argument parser)."""

    options: list[str]
    dest: str
    kind: str = "value"  # value | flag | bool_optional | const | append | help
    nargs: int | str | None = None
    choices: list[str] | None = None
    type: str | None = None
    default: str | None = None
    deprecated: bool = False
    help: str = ""


class FlagTable(BaseModel):
    """Every flag of one engine version, plus the engine's own list of environment variables."""

    engine: str
    version: str
    source: str  # "parser" (imported the engine's parser) or "help" (parsed --help text)
    actions: list[FlagSpec]
    env: list[str] = Field(default_factory=list)
    cache_path: str | None = None
    cache_hit: bool = False

    def lookup(self) -> dict[str, FlagSpec]:
        """Option string (as typed, and with ``_`` spelled ``-``) -> spec."""
        table: dict[str, FlagSpec] = {}
        for spec in self.actions:
            for opt in spec.options:
                table[opt] = spec
                table[opt.replace("_", "-")] = spec
        return table


class Problem(BaseModel):
    """One thing wrong (error: the engine would refuse it) or suspicious (warning)."""

    level: Literal["error", "warning"]
    kind: str
    subject: str
    message: str
    fix: str | None = None
    suggestion: str | None = None


@dataclass(frozen=True)
class ValueType:
    """A parser's value type (by the name ``dump_args.py`` records): what it accepts, in words."""

    accepts: Callable[[str], bool]
    expects: str  # "an integer", "true or false (1/0, yes/no, on/off)"


def _parses(kind: type) -> Callable[[str], bool]:
    def accepts(value: str) -> bool:
        try:
            kind(value)
        except ValueError:
            return False
        return True

    return accepts


#: value types of Python's own argparse, whatever the engine
VALUE_TYPES = {
    "int": ValueType(_parses(int), "an integer"),
    "float": ValueType(_parses(float), "a number"),
}


def has_flag(argv: list[str], flag: str) -> bool:
    """Whether ``argv`` sets ``flag`` (``--flag``, ``--flag=v`` or its ``_`` spelling)."""
    alt = flag.replace("-", "_")
    return any(t == flag or t.startswith(flag + "=") or t == "--" + alt[2:] for t in argv)


_HELP_OPT = re.compile(r"^  (-{1,2}[A-Za-z0-9][^\s,]*)(.*)$")


def parse_help_text(text: str) -> list[FlagSpec]:
    """Flags from argparse ``--help`` output (the fallback when the parser cannot be imported).

    Reads option lines such as ``  --dtype {auto,float32}``, ``  --enforce-eager,
    --no-enforce-eager`` or ``  --api-server-count API_SERVER_COUNT, -asc API_SERVER_COUNT``.
    Types are unknown from help text, so only presence, arity and choices are checked.
    """
    specs: list[FlagSpec] = []
    for line in text.splitlines():
        m = _HELP_OPT.match(line)
        if not m:
            continue
        head = (m.group(1) + m.group(2)).split("  ")[0].strip()
        options: list[str] = []
        metavar = ""
        for part in head.split(", "):
            tokens = part.split(" ", 1)
            if not tokens[0].startswith("-"):
                break
            options.append(tokens[0])
            if len(tokens) > 1:
                metavar = tokens[1]
        if not options:
            continue
        choices = None
        if metavar.startswith("{"):
            choices = metavar[1 : metavar.find("}")].split(",")
        negated = any(o.startswith("--no-") for o in options)
        nargs: int | str | None
        if negated:
            kind, nargs = "bool_optional", 0
        elif not metavar:
            kind, nargs = "flag", 0
        else:
            kind = "value"
            nargs = "+" if "..." in metavar and not metavar.startswith("[") else None
            if metavar.startswith("["):
                nargs = "*" if "..." in metavar else "?"
        help_line = line[len(m.group(0)) - len(m.group(2)) :].strip()
        specs.append(
            FlagSpec(
                options=options,
                dest=options[0].lstrip("-").replace("-", "_"),
                kind="help" if "--help" in options else kind,
                nargs=nargs,
                choices=choices,
                deprecated="deprecated" in help_line.lower(),
            )
        )
    return specs
