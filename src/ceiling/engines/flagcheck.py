"""preflight's checks of one variant's flags, values and environment variables.

Generic: every flag against the engine's own flag table (``FlagTable``: presence, ``--no-``
forms, spelling, arity, choices, the value types the adapter names, config keys inside JSON
values), and every variable against NCCL's documented list or the engine's own. What is one
engine's parser's quirk (vLLM's ``-O3``, llama-cpp-python's word booleans) comes from its
adapter (``Engine.canonical_flag``, ``flag_problems``, ``value_types``).
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from ceiling.engines.base import Engine, load_data
from ceiling.engines.flags import FlagSpec, FlagTable, Problem
from ceiling.engines.tables import NcclEnvFile, NcclValueRule
from ceiling.engines.variant import Arg, normalize_flag

# ---- flags -------------------------------------------------------------------------------


def check_args(args: list[Arg], table: FlagTable, engine: Engine) -> list[Problem]:
    """Every flag and value against the engine's flag table."""
    lookup = table.lookup()
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    for arg in args:
        flag, values = engine.canonical_flag(arg, lookup)
        problems.extend(engine.flag_problems(arg, flag, table.version))
        base, _, dotted = flag.partition(".")
        spec = lookup.get(base)
        negated = False
        if spec is None and base.startswith("--no-"):
            positive = lookup.get("--" + base[5:])
            if positive is not None and positive.kind == "bool_optional":
                spec, negated = positive, True
            elif positive is not None:
                problems.append(
                    Problem(
                        level="error",
                        kind="bad_flag_form",
                        subject=arg.flag,
                        message=f"{arg.flag}: {positive.options[0]} is a plain switch with no --no- form",
                        fix=f"leave {positive.options[0]} out instead",
                    )
                )
                continue
        if spec is None:
            problems.append(_unknown_flag(arg, base, lookup, engine, table.version))
            continue
        if not engine.dash_underscore_alias and not negated and arg.flag not in spec.options:
            right = next((o for o in spec.options if o.startswith("--")), spec.options[0])
            problems.append(
                Problem(
                    level="error",
                    kind="bad_flag_form",
                    subject=arg.flag,
                    message=(
                        f"{arg.flag} is spelled {right} by {engine.display_name}, whose parser "
                        "does not take - and _ alike"
                    ),
                    fix=f"write {right}",
                    suggestion=right,
                )
            )
            continue
        if spec.dest in seen and spec.kind != "append":  # append flags accumulate
            problems.append(
                Problem(
                    level="warning",
                    kind="duplicate_flag",
                    subject=arg.flag,
                    message=f"{arg.flag} is given twice (also as {seen[spec.dest]}); the last one wins",
                )
            )
        seen[spec.dest] = arg.flag
        if spec.deprecated:
            problems.append(
                Problem(
                    level="warning",
                    kind="deprecated_flag",
                    subject=arg.flag,
                    message=f"{arg.flag} is deprecated in {engine.name} {table.version}",
                    fix="check the engine's docs for its replacement",
                )
            )
        if dotted:
            problems.extend(_check_config_key(arg.flag, spec, dotted, engine, values))
            continue
        problems.extend(_check_values(arg, spec, values, negated, engine))
    return problems


def _unknown_flag(
    arg: Arg, base: str, lookup: dict[str, FlagSpec], engine: Engine, version: str
) -> Problem:
    name = normalize_flag(base)
    removed = engine.removed_flags().get(name) or engine.removed_flags().get(
        name.removeprefix("no-")
    )
    long_opts = sorted({o for spec in lookup.values() for o in spec.options if o[:2] == "--"})
    close = difflib.get_close_matches(base, long_opts, n=3, cutoff=0.6)
    suggestion = close[0] if close else None
    if removed:
        when = removed.removed_in
        message = (
            f"{arg.flag} is not accepted by {engine.name} {version}: removed in {when}"
            f"{' (approximately)' if removed.approximate else ''}: {removed.reason}"
        )
        repl = removed.replacement
        fix = f"use {repl}" if repl and not str(repl).startswith("nothing") else (repl or "drop it")
        return Problem(
            level="error",
            kind="removed_flag",
            subject=arg.flag,
            message=message,
            fix=f"{fix} [{removed.source}]".replace(" []", ""),
            suggestion=suggestion,
        )
    message = f"{arg.flag} is not a flag of {engine.name} {version}"
    if suggestion:
        message += f"; did you mean {suggestion}?"
    return Problem(
        level="error",
        kind="unknown_flag",
        subject=arg.flag,
        message=message,
        fix=f"use {suggestion}" if suggestion else "remove it (see `--help=all`)",
        suggestion=suggestion,
    )


def _check_values(
    arg: Arg, spec: FlagSpec, values: list[str], negated: bool, engine: Engine
) -> list[Problem]:
    problems: list[Problem] = []
    opt = spec.options[0] if spec.options else arg.flag
    if spec.kind in ("flag", "bool_optional", "const", "help") or negated:
        if values:
            problems.append(
                Problem(
                    level="error",
                    kind="unexpected_value",
                    subject=arg.flag,
                    message=f"{arg.flag} takes no value (got {' '.join(values)!r}); the engine would reject {values[0]!r}",
                    fix=(
                        f"write {opt} alone, or --no-{opt[2:]} to turn it off"
                        if spec.kind == "bool_optional"
                        else f"write {opt} alone"
                    ),
                )
            )
        return problems
    n = len(values)
    nargs = spec.nargs
    want_one = nargs is None or nargs == 1
    if (want_one and n != 1) or (nargs == "+" and n < 1) or (nargs == "?" and n > 1):
        problems.append(
            Problem(
                level="error",
                kind="missing_value" if n == 0 else "extra_values",
                subject=arg.flag,
                message=f"{arg.flag} expects {'one value' if want_one else nargs} but got {n}",
                fix=f"write {opt} VALUE",
            )
        )
        return problems
    if isinstance(nargs, int) and nargs > 1 and n != nargs:
        problems.append(
            Problem(
                level="error",
                kind="extra_values",
                subject=arg.flag,
                message=f"{arg.flag} expects {nargs} values but got {n}",
            )
        )
        return problems
    for value in values:
        problem = _check_value(arg.flag, spec, value, engine)
        if problem:
            problems.append(problem)
    return problems


def _check_value(flag: str, spec: FlagSpec, value: str, engine: Engine) -> Problem | None:
    if spec.choices:
        if value not in spec.choices:
            close = difflib.get_close_matches(value, spec.choices, n=1, cutoff=0.5)
            return Problem(
                level="error",
                kind="bad_value",
                subject=flag,
                message=f"{flag} {value!r} is not one of {spec.choices}",
                fix=f"use {close[0]!r}" if close else f"pick one of {spec.choices}",
                suggestion=close[0] if close else None,
            )
        return None
    vtype = engine.value_type(spec.type)
    if vtype is not None:
        return None if vtype.accepts(value) else _type_problem(flag, value, vtype.expects)
    if value.lstrip().startswith(("{", "[")):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            return Problem(
                level="error",
                kind="bad_value",
                subject=flag,
                message=f"{flag}: value is not valid JSON ({exc.msg} at column {exc.colno})",
                fix="quote JSON values with double quotes: '{\"key\": 1}'",
            )
        if isinstance(parsed, dict):
            problems = _check_config_dict(flag, spec, parsed, engine)
            return problems[0] if problems else None
    return None


def _type_problem(flag: str, value: str, what: str) -> Problem:
    return Problem(
        level="error",
        kind="bad_value",
        subject=flag,
        message=f"{flag} expects {what}, got {value!r}",
        fix=f"write {flag} followed by {what}",
    )


def _config_prefix(spec: FlagSpec) -> str:
    long = [o for o in spec.options if o.startswith("--")]
    return (long[0] if long else spec.options[0]).lstrip("-")


def _check_config_key(
    flag: str, spec: FlagSpec, dotted: str, engine: Engine, values: list[str]
) -> list[Problem]:
    """``-cc.level=3`` style: check the key path against the renamed-config-key table."""
    key = f"{_config_prefix(spec)}.{dotted}"
    return _renamed_key_problems(flag, key, engine)


def _check_config_dict(
    flag: str, spec: FlagSpec, parsed: dict[str, Any], engine: Engine, prefix: str | None = None
) -> list[Problem]:
    problems: list[Problem] = []
    base = prefix or _config_prefix(spec)
    for key, value in parsed.items():
        path = f"{base}.{key}"
        problems.extend(_renamed_key_problems(flag, path, engine))
        if isinstance(value, dict):
            problems.extend(_check_config_dict(flag, spec, value, engine, prefix=path))
    return problems


def _renamed_key_problems(flag: str, key: str, engine: Engine) -> list[Problem]:
    renamed = engine.renamed_config_keys().get(key)
    if not renamed:
        return []
    return [
        Problem(
            level="error",
            kind="renamed_config_key",
            subject=f"{flag} {key.split('.', 1)[1]}",
            message=(f"{key} was renamed in {engine.name} {renamed.removed_in}: {renamed.reason}"),
            fix=f"use {renamed.replacement}",
        )
    ]


# ---- environment -------------------------------------------------------------------------


def check_env(env: dict[str, str], table: FlagTable, engine: Engine) -> list[Problem]:
    """NCCL_* against NCCL's documented list; the engine's prefix against the engine's own list."""
    problems: list[Problem] = []
    nccl = load_data("nccl_env.yaml", NcclEnvFile)
    nccl_names = set(nccl.variables)
    nccl_values = nccl.values
    engine_names = set(table.env)
    for name, value in env.items():
        if name.startswith("NCCL_"):
            if name not in nccl_names:
                problems.append(_unknown_env(name, sorted(nccl_names), "NCCL"))
            elif name in nccl_values:
                problem = _check_nccl_value(name, value, nccl_values[name])
                if problem:
                    problems.append(problem)
        elif (
            engine.env_prefixes
            and name.startswith(engine.env_prefixes)
            and engine_names
            and name not in engine_names
        ):
            problems.append(
                _unknown_env(name, sorted(engine_names), f"{engine.name} {table.version}")
            )
    return problems


def _unknown_env(name: str, known: list[str], owner: str) -> Problem:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
    message = f"{name} is not a known {owner} environment variable: it would be silently ignored"
    if close:
        message += f"; did you mean {close[0]}?"
    return Problem(
        level="warning",
        kind="unknown_env",
        subject=name,
        message=message,
        fix=f"rename it to {close[0]}" if close else "remove it or check the spelling",
        suggestion=close[0] if close else None,
    )


def _check_nccl_value(name: str, value: str, rule: NcclValueRule) -> Problem | None:
    allowed = list(rule.allowed)
    lower = {a.lower(): a for a in allowed}
    items = [value]
    if rule.many:
        items = [v.strip().lstrip("^") for v in value.split(",") if v.strip()]
    bad = [v for v in items if v.lower() not in lower]
    if not bad:
        return None
    return Problem(
        level="warning",
        kind="bad_env_value",
        subject=name,
        message=f"{name}={value}: {', '.join(bad)} not among {allowed}",
        fix=f"use one of {allowed}",
    )
