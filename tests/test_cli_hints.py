"""Every hint that names a ceiling command line works (issue 38): each ``ceiling CMD --opt ...``
the package prints (fixes, notes, Reproduce lines, --help examples, files it writes) is parsed by
the real CLI parser, and none uses an option spelling that is only kept as a deprecated alias.

Strings are read from the source (an f-string's holes stand for values: one after an option is
given a stand-in value, one alone stands for optional words and is left out); docstrings are
skipped but for the command functions' in ``ceiling.cli`` (their --help).
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from ceiling.cli import _register_all, app
from ceiling.engines.llamacpp_server import LlamaServerEngine, parse_server_help

SRC = Path(__file__).resolve().parents[1] / "src" / "ceiling"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "engines"
HOLE = "\x00"
_CMD = re.compile(r"(?<![\w/.-])ceiling ([a-z][a-z-]*)([^`'\"\n;()]*)")
#: where a command line in prose ends
_STOPS = ("&&", " or ", ", ", "  ", ": ", " (", "|")


def _root() -> Any:
    _register_all()
    return typer.main.get_command(app)


def _docstrings(tree: ast.AST, keep_functions: bool) -> set[int]:
    """ids of the docstring nodes no user sees (a cli/ function's is its --help)."""
    kinds: tuple[type, ...] = (ast.Module, ast.ClassDef)
    if not keep_functions:
        kinds += (ast.FunctionDef, ast.AsyncFunctionDef)
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, kinds):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _printed_strings(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every string literal that can reach a user (f-string holes as HOLE)."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree, keep_functions=path.parent.name == "cli")
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):  # its constant parts are read as one string
            skip.update(id(v) for v in node.values)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in node.values)
            yield node.lineno, text
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def _command_lines() -> list[tuple[str, list[str]]]:
    """(where, argv after ``ceiling``) of every command line with an option in a string."""
    commands = set(_root().commands)
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for line, text in _printed_strings(path):
            for m in _CMD.finditer(text):
                rest = m.group(2)
                for stop in _STOPS:
                    rest = rest.split(stop, 1)[0]
                if m.group(1) not in commands or "--" not in rest:
                    continue
                try:
                    argv = shlex.split(m.group(1) + rest)
                except ValueError:
                    continue
                where = f"{path.relative_to(SRC.parent)}:{line}"
                found.append((where, [a for a in argv if a != "..."]))
    return found


def _parse(argv: list[str], stand_in: str) -> tuple[Any, Any]:
    """(command, its parsed context) for ``ceiling argv``; raises what the CLI would."""
    cmd, path, args = _root(), ["ceiling"], list(argv)
    while hasattr(cmd, "commands") and args and args[0] in cmd.commands:
        path.append(args[0])
        cmd = cmd.commands[args.pop(0)]
    takes_value = {
        o: not p.is_flag for p in cmd.params if p.param_type_name == "option" for o in p.opts
    }
    positional = any(p.param_type_name == "argument" for p in cmd.params)
    filled = []
    for i, arg in enumerate(args):
        if HOLE in arg:
            after_option = bool(i and takes_value.get(args[i - 1]))
            if not (after_option or positional):
                continue  # optional words of the line (`{target}`)
            arg = arg.replace(HOLE, stand_in) if arg != HOLE else stand_in
        filled.append(arg)
    return cmd, cmd.make_context(" ".join(path), filled, resilient_parsing=False)


def _problem(argv: list[str]) -> str | None:
    """Why ``ceiling argv`` does not parse, or names a deprecated option (None: it works)."""
    errors = []
    for stand_in in ("1", "X.json"):
        try:
            cmd, ctx = _parse(argv, stand_in)
        except Exception as exc:  # the CLI's own parse errors (typer's click)
            if type(exc).__name__ == "Exit":  # --help, --version: parsed, then exit 0
                return None
            errors.append(f"{type(exc).__name__}: {getattr(exc, 'format_message', str)()}")
            continue
        old = [
            p.opts[0]
            for p in cmd.params
            if getattr(p, "hidden", False)
            and p.name is not None
            and ctx.get_parameter_source(p.name).name == "COMMANDLINE"
        ]
        return f"deprecated spelling {old}" if old else None
    return "; ".join(errors)


def test_the_scan_finds_the_hints_it_must_check() -> None:
    lines = {" ".join(argv) for _, argv in _command_lines()}
    # fixes that name a command (the doctor's Reproduce lines are built from its config with
    # shlex, not written as text: tests/test_doctor_setup.py parses those with the real CLI)
    assert "predict --list-models" in lines
    assert any(line.startswith("launch ") and "--ready-timeout" in line for line in lines)


@pytest.mark.parametrize(
    ("where", "argv"), _command_lines(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_each_printed_command_line_parses_with_the_real_cli(where: str, argv: list[str]) -> None:
    problem = _problem(argv)
    assert problem is None, f"{where}: `ceiling {' '.join(argv)}`: {problem}"


def test_no_hint_names_an_option_spelling_kept_only_for_old_scripts() -> None:
    """A hidden option is an old spelling (docs/cli.md: renamed, kept one release); a hint
    names the current one. engines/ is left out: its strings are engine flags (SGLang's own
    --model-path), not ceiling's."""
    hidden, visible = set(), set()
    stack = [_root()]
    while stack:
        cmd = stack.pop()
        stack.extend(getattr(cmd, "commands", {}).values())
        for p in cmd.params:
            (hidden if getattr(p, "hidden", False) else visible).update(p.opts)
    old_only = hidden - visible
    assert "--model-path" in old_only
    stale = []
    for path in sorted(SRC.rglob("*.py")):
        if path.parent.name in ("cli", "engines"):
            continue
        for line, text in _printed_strings(path):
            for opt in old_only:
                if re.search(re.escape(opt) + r"(?![\w-])", text):
                    stale.append(f"{path.relative_to(SRC.parent)}:{line}: {opt} in {text[:80]!r}")
    assert not stale, "\n".join(stale)


def test_llama_servers_hints_name_only_flags_its_help_lists() -> None:
    """A hint for llama-server names a flag the binary has (its --help, captured in the
    fixture); ``--logits_all`` is llama-cpp-python's, and llama-server has no flag that returns
    prompt log-probabilities (its /v1/completions refuses ``echo``)."""
    help_text = (FIXTURES / "llama-server_b1-0c1e570_help.txt").read_text()
    specs, _ = parse_server_help(help_text)
    known = {o for s in specs for o in s.options}
    engine = LlamaServerEngine()
    hints = [engine.prompt_logprobs_hint, *engine.finding_fixes.values()]
    named = {
        flag.replace("_", "-")  # llama.cpp's parser reads _ as - (dash_underscore_alias)
        for hint in hints
        # the flags of llama-server itself (a `llama-perplexity ...` command line is another tool)
        for flag in re.findall(r"(?<![\w`-])--[a-z][\w-]*", re.sub(r"`[^`]*`", "", hint))
    }
    assert named, hints
    assert named <= known, named - known
    assert "llama-perplexity" in engine.prompt_logprobs_hint


def _fixes(node: Any, key: str = "") -> Iterator[str]:
    """The strings a data file gives as advice (``fix``) anywhere in its tree."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _fixes(v, str(k))
    elif isinstance(node, list):
        for v in node:
            yield from _fixes(v, key)
    elif isinstance(node, str) and key == "fix":
        yield node


def test_no_fix_in_the_packaged_data_points_into_experiments() -> None:
    """A pip install has no ``experiments/``: the fixes the packaged data gives (the death
    causes', the rules') name only commands and files a user has; the code's own strings are
    checked by tests/test_import_contract.py. Provenance (``source:``) may cite the repository."""
    import yaml

    fixes = {
        (str(path.relative_to(SRC)), fix)
        for path in sorted(SRC.rglob("*.yaml"))
        for fix in _fixes(yaml.safe_load(path.read_text(encoding="utf-8")))
    }
    assert len(fixes) >= 20  # the scan reads them (24 today)
    bad = {f"{path}: {fix}" for path, fix in fixes if "experiments/" in fix}
    assert not bad, "\n".join(sorted(bad))
