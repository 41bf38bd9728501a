"""Variant files: one engine configuration (engine, model, flags, environment) in YAML or TOML.

A variant is what a user relaunches by hand today: ``vllm serve MODEL --flags`` with some
``NCCL_*`` exported. Writing it down lets ``preflight`` check it against the installed engine
before a 36-minute load, ``launch`` start it reproducibly, and ``sweep`` compare variants.

Merge rules for ``extends`` (path relative to the extending file; chains allowed, cycles refused):
- scalars (engine, model, host, port, log_dir, python, command, served_model_name): the child's
  value wins when it sets one;
- ``env``: merged by name, the child wins; a child value of ``null`` removes the parent's variable;
- ``args``: merged by flag name (``--max_model_len`` and ``--max-model-len`` are the same flag,
  ``--no-x`` replaces ``--x``); the child's flag replaces the parent's occurrences in place, new
  flags are appended, a flag repeated within one file keeps every occurrence, and ``null``
  (mapping form) removes the parent's flag.

``args`` may be a list of command-line tokens (``["--max-model-len", "512", "--enforce-eager"]``)
or a mapping (``{max-model-len: 512, enforce-eager: true, enable-prefix-caching: false}``): in a
mapping ``true`` is the bare flag, ``false`` is its ``--no-`` form, and a list repeats values.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError

from ceiling.errors import CeilingError
from ceiling.inputs import read_text
from ceiling.redact import is_secret_name, register

SCHEMA_VERSION = 1
_SCALARS = ("engine", "model", "served_model_name", "host", "port", "log_dir", "python", "command")
_NUMBER = re.compile(r"^-\d|^-\.\d")


class Arg(BaseModel):
    """One command-line flag and the values that follow it (``[]`` for a bare flag)."""

    flag: str
    values: list[str] = Field(default_factory=list)

    @property
    def key(self) -> str:
        """Normalised name used for merging: dashes, no leading ``--``, ``_`` == ``-``."""
        return normalize_flag(self.flag)

    def tokens(self) -> list[str]:
        return [self.flag, *self.values]


class Variant(BaseModel):
    """A fully merged variant: everything needed to preflight and launch one server."""

    schema_version: int = SCHEMA_VERSION
    name: str
    engine: str
    model: str
    served_model_name: str | None = None
    args: list[Arg] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int | None = None
    log_dir: str = "logs"
    python: str | None = None
    command: list[str] | None = None
    source: str | None = None
    extends_chain: list[str] = Field(default_factory=list)

    def argv(self) -> list[str]:
        """The engine flags as command-line tokens, in order."""
        return [tok for arg in self.args for tok in arg.tokens()]

    def model_path(self) -> Path | None:
        """The model as a local path, when it looks like one (a hub id returns None)."""
        p = Path(self.model).expanduser()
        if p.is_absolute() or self.model.startswith((".", "~")) or p.exists():
            return p
        return None

    def with_overrides(
        self,
        port: int | None = None,
        host: str | None = None,
        log_dir: str | None = None,
        model: str | None = None,
    ) -> Variant:
        """A copy with launch-time overrides (the test fixtures pick a free port this way)."""
        data = self.model_dump()
        if model is not None:
            data["model"] = model
        if port is not None:
            data["port"] = port
        if host is not None:
            data["host"] = host
        if log_dir is not None:
            data["log_dir"] = log_dir
        return Variant.model_validate(data)


def normalize_flag(flag: str) -> str:
    """``--max_model_len`` / ``max-model-len`` -> ``max-model-len`` (dotted parts kept)."""
    name = flag.lstrip("-")
    head, dot, rest = name.partition(".")
    return head.replace("_", "-") + dot + rest


def parse_arg_list(tokens: list[Any], where: str) -> list[Arg]:
    """Group command-line tokens into flags and their values (``--x=1`` splits at ``=``)."""
    args: list[Arg] = []
    for raw in tokens:
        if isinstance(raw, bool) or raw is None or isinstance(raw, dict | list):
            raise CeilingError(
                f"{where}: args list holds {raw!r}; it must hold command-line strings",
                fix='write args as ["--flag", "value", ...] or as a mapping {flag: value}',
            )
        tok = str(raw)
        if tok.startswith("-") and not _NUMBER.match(tok):
            if "=" in tok:
                flag, value = tok.split("=", 1)
                args.append(Arg(flag=flag, values=[value]))
            else:
                args.append(Arg(flag=tok))
        elif args:
            args[-1].values.append(tok)
        else:
            raise CeilingError(
                f"{where}: args start with a value {tok!r}, not a flag",
                fix="put the model under `model:`; args hold only flags and their values",
            )
    return args


def parse_arg_mapping(mapping: dict[str, Any], where: str) -> list[Arg | str]:
    """Mapping form -> Args; a ``None`` value becomes the string marker ``"-" + key`` (removal)."""
    out: list[Arg | str] = []
    for key, value in mapping.items():
        name = str(key).lstrip("-")
        flag = ("-" if len(name) <= 2 else "--") + name
        if value is None:
            out.append("-" + normalize_flag(name))
        elif value is True:
            out.append(Arg(flag=flag))
        elif value is False:
            out.append(Arg(flag="--no-" + name))
        elif isinstance(value, list):
            out.append(Arg(flag=flag, values=[_scalar(v) for v in value]))
        else:
            out.append(Arg(flag=flag, values=[_scalar(value)]))
    return out


def _scalar(value: Any) -> str:
    """A YAML/TOML value as a command-line string (mappings as compact JSON)."""
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _merge_args(base: list[Arg], child: list[Arg | str]) -> list[Arg]:
    """The parent's args with the child's applied (see the module docstring for the rules).

    Only the PARENT's flags are replaced: a flag the child repeats (``--middleware a
    --middleware b``) keeps every occurrence.
    """
    merged = list(base)
    from_base = {id(a) for a in base}
    for item in child:
        if isinstance(item, str):  # removal marker
            key = item[1:]
            merged = [a for a in merged if a.key not in (key, _negated(key))]
            continue
        keys = (item.key, _negated(item.key))
        hits = [i for i, a in enumerate(merged) if id(a) in from_base and a.key in keys]
        if not hits:
            merged.append(item)
            continue
        merged[hits[0]] = item
        merged = [a for i, a in enumerate(merged) if i not in hits[1:]]
    return merged


def _negated(key: str) -> str:
    """``no-x`` <-> ``x``: a child's ``--no-enforce-eager`` replaces the parent's flag."""
    return key[3:] if key.startswith("no-") else "no-" + key


def _read(path: Path) -> dict[str, Any]:
    text = read_text(
        path,
        "variant file",
        fix="pass a variant YAML/TOML file (see examples/variants/; extends is relative to the file)",
    )
    try:
        data = tomllib.loads(text) if path.suffix.lower() == ".toml" else yaml.safe_load(text)
    except Exception as exc:  # yaml.YAMLError / tomllib.TOMLDecodeError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CeilingError(
            f"malformed variant file {path}: {first}",
            fix="fix the YAML/TOML syntax (see examples/variants/)",
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise CeilingError(
            f"malformed variant file {path}: top level is {type(data).__name__}, not a mapping",
            fix="write `engine: vllm`, `model: ...`, `args: ...` at the top level",
        )
    return data


_KNOWN_KEYS = {*_SCALARS, "name", "args", "env", "extends", "schema_version", "description"}


def _raw_merged(path: Path, seen: tuple[Path, ...]) -> tuple[dict[str, Any], list[Path]]:
    path = path.resolve()
    if path in seen:
        cycle = " -> ".join(str(p.name) for p in (*seen, path))
        raise CeilingError(f"variant extends cycle: {cycle}", fix="remove the circular `extends`")
    data = _read(path)
    unknown = set(data) - _KNOWN_KEYS
    if unknown:
        raise CeilingError(
            f"{path}: unknown key(s) {sorted(unknown)}",
            fix=f"allowed keys: {sorted(_KNOWN_KEYS)}",
        )
    where = str(path)
    args_raw = data.get("args") or []
    if isinstance(args_raw, dict):
        child_args: list[Arg | str] = parse_arg_mapping(args_raw, where)
    elif isinstance(args_raw, list):
        child_args = list(parse_arg_list(args_raw, where))
    elif isinstance(args_raw, str):
        child_args = list(parse_arg_list(_split(args_raw, where, "args"), where))
    else:
        raise CeilingError(
            f"{where}: `args` must be a list or a mapping", fix="see docs/engines.md"
        )
    env_raw = data.get("env") or {}
    if not isinstance(env_raw, dict):
        raise CeilingError(
            f"{where}: `env` must be a mapping NAME: value", fix="see docs/engines.md"
        )

    chain: list[Path] = []
    if data.get("extends"):
        parent_path = (path.parent / str(data["extends"])).resolve()
        base, chain = _raw_merged(parent_path, (*seen, path))
    else:
        base = {"args": [], "env": {}}
    merged = {k: v for k, v in base.items() if k not in ("args", "env")}
    for key in _SCALARS:
        if data.get(key) is not None:
            merged[key] = data[key]
    merged["args"] = _merge_args(base["args"], child_args)
    env = dict(base["env"])
    for name, value in env_raw.items():
        if value is None:
            env.pop(str(name), None)
        else:
            env[str(name)] = _scalar(value)
    merged["env"] = env
    merged["name"] = data.get("name") or path.stem
    return merged, [*chain, path]


def _split(text: str, where: str, key: str) -> list[str]:
    """A shell-like string as words; an unbalanced quote is one line naming the key."""
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise CeilingError(
            f"{where}: `{key}` is not a valid command line ({exc}): {text!r}",
            fix=f"balance the quotes in `{key}`, or write it as a YAML list",
        ) from None


def load_variant(path: str | Path) -> Variant:
    """Read a variant file (YAML or TOML), resolving ``extends``; raises CeilingError on bad input."""
    p = Path(path)
    merged, chain = _raw_merged(p, ())
    for required in ("engine", "model"):
        if not merged.get(required):
            raise CeilingError(
                f"variant {p} has no `{required}`",
                fix=f"add `{required}: ...` to the file or to the one it extends",
            )
    command = merged.get("command")
    if isinstance(command, str):
        merged["command"] = _split(command, str(p), "command")
    if merged.get("port") is not None:
        try:
            merged["port"] = int(merged["port"])
        except (TypeError, ValueError):
            raise CeilingError(
                f"variant {p}: port {merged['port']!r} is not a number", fix="port: 8000"
            ) from None
        if not 1 <= merged["port"] <= 65535:
            raise CeilingError(
                f"variant {p}: port {merged['port']} is not a TCP port",
                fix="port: between 1 and 65535 (or leave it out: a free port is picked)",
            )
    merged["engine"] = str(merged["engine"]).lower()
    merged["model"] = str(merged["model"])
    merged["source"] = str(p.resolve())
    merged["extends_chain"] = [str(c) for c in chain[:-1]]
    # Relative model paths and log dirs are relative to the variant file that is loaded.
    model = Path(merged["model"]).expanduser()
    if merged["model"].startswith((".", "~")):
        merged["model"] = str((p.resolve().parent / model).resolve())
    try:
        variant = Variant.model_validate(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise CeilingError(
            f"malformed variant {p}: {where}: {err['msg']}", fix="see docs/engines.md"
        ) from None
    _register_secrets(variant)
    return variant


def _register_secrets(variant: Variant) -> None:
    """Secret flag values (``--api-key X``) and variables (``HF_TOKEN``) of the variant are
    masked in everything ceiling prints or writes from now on (``ceiling.redact``)."""
    register(v for arg in variant.args if is_secret_name(arg.flag) for v in arg.values)
    register(v for k, v in variant.env.items() if is_secret_name(k))
