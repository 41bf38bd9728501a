"""Check a variant against the INSTALLED engine before anything loads.

The founding story lost a 36-minute load to ``--num-scheduler-steps``, a flag the installed vLLM
no longer had. preflight asks the engine itself which flags it accepts (its own argument parser,
dumped once per engine version and cached), then checks every flag, value and environment
variable of the variant, says *why* a flag is unknown when we know (removed/renamed-flag table),
and suggests the closest valid flag. No model is loaded and no GPU is touched; with the cache
warm a whole sweep plan is checked in well under a second per variant.
"""

from __future__ import annotations

import difflib
import json
import re
import time
from typing import TYPE_CHECKING, Any, Literal

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, Field

from ceiling.engines import get_engine
from ceiling.engines.base import FlagSpec, FlagTable, load_data
from ceiling.engines.variant import Arg, Variant, normalize_flag

if TYPE_CHECKING:
    from ceiling.engines.base import Engine

SCHEMA_VERSION = 1
_HUMAN_INT = re.compile(r"^\d+(\.\d+)?\s*[kKmMgGtT]?[iI]?[bB]?$")
# values of a ``bool_word`` flag (the words llama-cpp-python's ``_parse_bool_arg`` accepts)
_BOOL_WORDS = frozenset({"1", "on", "t", "true", "y", "yes", "0", "off", "f", "false", "n", "no"})


class Problem(BaseModel):
    """One thing wrong (error: the engine would refuse it) or suspicious (warning)."""

    level: Literal["error", "warning"]
    kind: str
    subject: str
    message: str
    fix: str | None = None
    suggestion: str | None = None


class PreflightReport(BaseModel):
    """The verdict on one variant: ``ok`` is False when any problem is an error."""

    schema_version: int = SCHEMA_VERSION
    variant: str
    engine: str
    engine_version: str | None = None
    flag_source: str | None = None
    flags_cache: str | None = None
    cache_hit: bool = False
    flags_checked: int = 0
    env_checked: int = 0
    problems: list[Problem] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    environment: dict[str, Any] | None = None  # `ceiling env`'s report of the engine's Python
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(p.level == "error" for p in self.problems)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.level == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.level == "warning"]

    def summary(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        data["ok"] = self.ok
        return data


def preflight(variant: Variant, refresh: bool = False, env_check: bool = True) -> PreflightReport:
    """Check ``variant``'s model path, flags and environment against the installed engine, and
    (``env_check``) the engine's Python environment and this host (``ceiling env``)."""
    t0 = time.monotonic()
    engine = get_engine(variant.engine)
    report = PreflightReport(variant=variant.name, engine=engine.name)
    model_path = variant.model_path()
    if model_path is not None and not model_path.exists():
        report.problems.append(
            Problem(
                level="error",
                kind="model_missing",
                subject=str(model_path),
                message=f"model path not found: {model_path}",
                fix="fix `model:` in the variant",
            )
        )
    install = engine.locate(variant)
    report.notes.extend(install.notes)
    table = engine.flag_table(install, refresh=refresh)
    report.engine_version = table.version
    report.flag_source = table.source
    report.flags_cache = table.cache_path
    report.cache_hit = table.cache_hit
    report.problems.extend(check_args(variant.args, table, engine))
    report.flags_checked = len(variant.args)
    report.problems.extend(check_env(variant.env, table, engine))
    report.env_checked = len(variant.env)
    if env_check and install.python is not None:  # `ceiling env` of the engine's Python
        from ceiling.envcheck.check import check_for_preflight

        tp = engine.tensor_parallel(variant)
        report.environment, found = check_for_preflight(str(install.python), tp, variant.env)
        report.problems.extend(Problem.model_validate(f) for f in found)
    report.elapsed_s = round(time.monotonic() - t0, 3)
    return report


def preflight_many(variants: list[Variant], refresh: bool = False) -> list[PreflightReport]:
    """Check every variant of a plan before the first launch (flag tables are shared/cached)."""
    return [preflight(v, refresh=refresh) for v in variants]


# ---- flags -------------------------------------------------------------------------------


def check_args(args: list[Arg], table: FlagTable, engine: Engine) -> list[Problem]:
    """Every flag and value against the engine's flag table."""
    lookup = table.lookup()
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    for arg in args:
        flag, values = _canonical(arg, lookup)
        if flag == "--optimization-level" and arg.flag.startswith("-O"):
            problems.extend(_o_semantics(arg, engine, table.version))
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


def _canonical(arg: Arg, lookup: dict[str, FlagSpec]) -> tuple[str, list[str]]:
    """Spell the flag the way the engine's parser sees it (``_``->``-``, ``-O3``)."""
    flag = arg.flag
    if flag.startswith("-O") and not flag.startswith("--") and "--optimization-level" in lookup:
        rest = flag[2:].lstrip("=")
        if rest:
            return "--optimization-level", [rest, *arg.values]
        return "--optimization-level", arg.values
    if flag.startswith("--"):
        head, dot, tail = flag[2:].partition(".")
        return "--" + head.replace("_", "-") + dot + tail, arg.values
    return flag, arg.values


def _o_semantics(arg: Arg, engine: Engine, version: str) -> list[Problem]:
    """``-O<n>`` changed meaning (compilation level -> optimization level): say which applies."""
    info = engine.renamed_config_keys().get("O-level")
    if not info or _release(version) < _release(str(info.get("removed_in", "0"))):
        return []
    return [
        Problem(
            level="warning",
            kind="semantics_changed",
            subject=arg.flag,
            message=f"{arg.flag} in {engine.name} {version}: {info.get('reason')}",
            fix=f"keep it if you mean the optimization level; else {info.get('replacement')}",
        )
    ]


def _release(version: str) -> Version:  # 0.11.0rc1+cpu -> 0.11.0 (== 0.11); unparsable -> 0
    try:
        return Version(Version(version).base_version)
    except InvalidVersion:
        return Version("0")


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
        when = removed.get("removed_in")
        message = (
            f"{arg.flag} is not accepted by {engine.name} {version}: removed in {when}"
            f"{' (approximately)' if removed.get('approximate') else ''}: {removed.get('reason')}"
        )
        repl = removed.get("replacement")
        fix = f"use {repl}" if repl and not str(repl).startswith("nothing") else (repl or "drop it")
        return Problem(
            level="error",
            kind="removed_flag",
            subject=arg.flag,
            message=message,
            fix=f"{fix} [{removed.get('source', '')}]".replace(" []", ""),
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
    kind = spec.type or ""
    if kind == "int":
        try:
            int(value)
        except ValueError:
            return _type_problem(flag, value, "an integer")
    elif kind == "float":
        try:
            float(value)
        except ValueError:
            return _type_problem(flag, value, "a number")
    elif kind.startswith("human_readable_int"):
        if not (_HUMAN_INT.match(value) or (kind.endswith("auto") and value == "auto")):
            return _type_problem(flag, value, "an integer like 512, 4k or 1M")
    elif kind == "bool_word":  # a boolean spelled as a value (llama-cpp-python: --verbose false)
        if value.strip().lower() not in _BOOL_WORDS:
            return _type_problem(flag, value, "true or false (1/0, yes/no, on/off)")
    elif kind == "json_object":
        try:
            if not isinstance(json.loads(value), dict):
                return _type_problem(flag, value, "a JSON object")
        except json.JSONDecodeError:
            return _type_problem(flag, value, "a JSON object")
    elif value.lstrip().startswith(("{", "[")):
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
            message=(
                f"{key} was renamed in {engine.name} {renamed.get('removed_in')}: "
                f"{renamed.get('reason')}"
            ),
            fix=f"use {renamed.get('replacement')}",
        )
    ]


# ---- environment -------------------------------------------------------------------------


def check_env(env: dict[str, str], table: FlagTable, engine: Engine) -> list[Problem]:
    """NCCL_* against NCCL's documented list; the engine's prefix against the engine's own list."""
    problems: list[Problem] = []
    nccl = load_data("nccl_env.yaml")
    nccl_names = set(nccl.get("variables", []))
    nccl_values: dict[str, dict[str, Any]] = nccl.get("values", {})
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


def _check_nccl_value(name: str, value: str, rule: dict[str, Any]) -> Problem | None:
    allowed = [str(a) for a in rule.get("allowed", [])]
    lower = {a.lower(): a for a in allowed}
    items = [value]
    if rule.get("list"):
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


# ---- command -----------------------------------------------------------------------------


def run_preflight(paths: list[Any], refresh: bool = False, json_out: bool = False) -> int:
    """``ceiling preflight``: load + check every variant first, print, exit 1 on any error."""
    from rich.markup import escape

    from ceiling.console import console, emit_json, out
    from ceiling.engines.variant import load_variant

    variants = [load_variant(p) for p in paths]
    reports: list[PreflightReport] = []
    con = console()
    for variant in variants:
        if not json_out:
            with con.status(f"{variant.name}: asking {variant.engine} for its flags"):
                reports.append(preflight(variant, refresh=refresh))
        else:
            reports.append(preflight(variant, refresh=refresh))
    if json_out:
        emit_json(
            {
                "schema_version": SCHEMA_VERSION,
                "ok": all(r.ok for r in reports),
                "reports": [r.summary() for r in reports],
            }
        )
    else:
        o = out()
        for r in reports:
            verdict = "[green]ok[/green]" if r.ok else "[red]FAIL[/red]"
            cache = "cached flags" if r.cache_hit else "flags read from the engine"
            o.print(
                f"{verdict} {r.variant}: {r.engine} {r.engine_version}, {r.flags_checked} flags, "
                f"{r.env_checked} env vars checked ({cache}, {r.elapsed_s:.2f} s)"
            )
            for note in r.notes:
                o.print(f"   note: {escape(note)}", soft_wrap=True)
            for p in r.problems:
                colour = "red" if p.level == "error" else "yellow"
                o.print(f"   [{colour}]{p.level}[/{colour}] {escape(p.message)}", soft_wrap=True)
                if p.fix:
                    o.print(f"      fix: {escape(p.fix)}", soft_wrap=True)
    return 0 if all(r.ok for r in reports) else 1
