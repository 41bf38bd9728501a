"""The ``ceiling`` command line: one thin Typer app.

Each command group lives in its own module under ``ceiling.cli`` and only parses options and
calls one function of a library module; it holds no logic. Library modules are imported inside
the command functions so that ``ceiling --help`` and ``ceiling predict`` start fast.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from ceiling.errors import CeilingError, ExitStatus

app = typer.Typer(
    name="ceiling",
    help=(
        "How fast can this LLM deployment go, how fast does it go, and where does the gap go?\n\n"
        "predict: the analytic ceiling | bench/compare: measure, with statistics | "
        "preflight/launch/inspect: engines | probe/commbench/calibrate: the box | "
        "sanity: is the output right | "
        "doctor/sweep: all of it, with a verdict and a report."
    ),
    no_args_is_help=True,
    add_completion=True,  # --install-completion: shells complete commands, options, choices
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# Command groups, in the order --help lists them. Each module exposes ``register(app)``.
_GROUPS = (
    "predict",
    "bench",
    "engines",
    "probe",
    "sanity",
    "doctor",
    "trace",
    "env",
    "deploy",
)


_registered: list[str] = []


def _register_all() -> None:
    """Add every group's commands, once (tests call ``main`` many times in one process)."""
    import importlib

    for name in _GROUPS:
        if name not in _registered:
            importlib.import_module(f"ceiling.cli.{name}").register(app)
            _registered.append(name)


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    if version:
        from ceiling import __version__

        typer.echo(__version__)
        raise typer.Exit(ExitStatus.OK)
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(ExitStatus.OK)


#: Metavars in --help: what the value is, not a Python type (``<list[Path]>``, ``<int range>``).
_METAVARS = {
    "url": "URL",
    "out": "PATH",
    "results": "FILE",
    "merge": "FILE",
    "profile": "FILE",
    "dataset": "FILE",
    "variant": "FILE",
    "log": "FILE",
    "root": "DIR",
    "model": "MODEL",
    "model_path": "MODEL",
    "gpu": "GPU",
    "link": "LINK",
    "engine": "ENGINE",
    "concurrency": "N,N,...",
    "world_sizes": "N,N,...",
    "batch": "N,N,...",
    "sizes": "SIZES",
    "env": "KEY=V,...",
    "logit_bias": "JSON",
    "timeout": "SECONDS",
    "launch_timeout": "SECONDS",
    "stall_timeout": "SECONDS",
    "duration": "SECONDS",
    "port": "PORT",
}


def _plain_metavars(group: Any) -> None:
    """Give every option a plain metavar (``URL``, ``FILE``, ``N``) and drop the Python type
    Typer prints after arguments, so --help shows no ``<list[Path]>`` or ``<int range>``.
    (Typer vendors its own Click: parameters are told apart by ``param_type_name``.)"""
    for cmd in group.commands.values():
        for param in cmd.params:
            if param.param_type_name == "argument":
                param.display_type_rich = lambda ctx: None
                if param.metavar is None:
                    param.metavar = (param.name or "arg").upper().removesuffix("S")
                continue
            if param.param_type_name != "option" or param.is_flag or param.metavar:
                continue
            choices = _choices(param)
            if choices:  # an enumeration: --help lists it (`--engine [vllm|sglang|...]`)
                param.metavar = "[" + "|".join(choices) + "]"
                continue
            name, kind = param.name or "", _type_label(param)
            if name in _METAVARS and not (name == "batch" and "str" not in kind):
                param.metavar = _METAVARS[name]
            elif "int" in kind:
                param.metavar = "N"
            elif "float" in kind:
                param.metavar = "NUM"
            elif "path" in kind:
                param.metavar = "PATH"
            else:
                param.metavar = "TEXT"


def _choices(param: Any) -> list[str]:
    """The choices of an enumerated option ([] if none): Typer >= 0.29 describes them itself
    (``type_descriptor``), older Typers hand Click a ``Choice``."""
    desc = getattr(param, "type_descriptor", None)
    if desc is not None and getattr(desc, "is_choice", False):
        return [str(c) for c in desc.choices or ()]
    return [str(c) for c in getattr(getattr(param, "type", None), "choices", None) or ()]


def option_kind(param: Any) -> str:
    """What an option takes, in the words of docs/cli.md's table: ``flag``, ``choice``,
    ``file``, ``dir``, ``path``, ``number`` (an int, a float or a list ``N,N,...``), ``text``."""
    if getattr(param, "is_flag", False):
        return "flag"
    if _choices(param):
        return "choice"
    info = getattr(getattr(param, "type_descriptor", None), "parameter_info", None)
    click_type = getattr(param, "type", None)
    path = info if info is not None and _is_path(param) else click_type
    if _is_path(param):
        if getattr(path, "file_okay", True) is False:
            return "dir"
        if getattr(path, "dir_okay", True) is False:
            return "file"
        return "path"
    label = _type_label(param)
    if "int" in label or "float" in label or param.metavar == "N,N,...":
        return "number"
    return "text"


def _is_path(param: Any) -> bool:
    desc = getattr(param, "type_descriptor", None)
    if desc is not None:
        return bool(getattr(desc, "is_path", False))
    return "path" in _type_label(param)


def _type_label(param: Any) -> str:
    """What kind of value an option takes ("integer range", "<float>", "path", "text"): Typer
    >= 0.29 describes its parameters itself (``display_type``), older Typers hand Click a Click
    ``ParamType`` (``param.type.name``); both are seen in the field (0.27 on the GPU image)."""
    click_type = getattr(param, "type", None)
    if click_type is not None:
        return str(getattr(click_type, "name", "") or "").lower()
    show = getattr(param, "display_type", None)
    if callable(show):
        try:
            return str(show(None)).lower()
        except Exception:  # a help label must never stop the CLI from starting
            return ""
    return ""


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _command_of(argv: list[str] | None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return next((a for a in args if not a.startswith("-")), "")


_built: list[Any] = []


def _command() -> Any:
    """The Click command of the app, built once per process."""
    if not _built:
        _register_all()
        command = typer.main.get_command(app)
        _plain_metavars(command)
        _built.append(command)
    return _built[0]


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app, turning expected failures into one-line errors.

    Every exception is mapped to its exit code by :func:`ceiling.errors.exit_status` (one
    place; an ``OSError`` nothing handled, such as a full disk, is a CeilingError made by
    :func:`ceiling.errors.from_os_error`): a :class:`CeilingError` becomes ``error: ...``
    plus ``fix: ...`` on stderr, a Click usage error its usage lines (exit 2), an interrupt
    (Ctrl-C, SIGTERM, SIGHUP) unwinds every ``finally`` and exits 130. With ``--json`` the
    error is also one JSON object on stdout (:func:`ceiling.errors.error_payload`), unless the
    command already printed its result there. Messages pass through the secret redactor.
    """
    from ceiling import console, interrupts
    from ceiling.errors import exit_status, from_os_error
    from ceiling.redact import redact

    args = sys.argv[1:] if argv is None else list(argv)
    command = _command()
    previous = interrupts.install()
    printed = console.json_documents()
    try:
        code = command.main(args=args, prog_name="ceiling", standalone_mode=False)
        code = 0 if code is None else code
        if code == ExitStatus.INTERRUPTED and interrupts.requested() is not None:
            _fail(args, f"interrupted ({interrupts.describe()})", None, code, printed)
        return int(code)
    except SystemExit as ended:  # sys.exit() inside a command: its code, as Click would
        return ended.code if isinstance(ended.code, int) else (0 if ended.code is None else 1)
    except BaseException as raised:
        exc = from_os_error(raised) or raised
        status = exit_status(exc)
        if status is None:
            raise  # a bug: keep its traceback
        if isinstance(exc, CeilingError):
            message, fix = exc.message, exc.fix or f"see `ceiling {_command_of(args)} --help`"
            if status != ExitStatus.ENGINE:  # one line: a value's own line breaks shown as \n
                message, fix = _one_line(message), _one_line(fix)
            print(redact(f"error: {message}\n  fix: {fix}"), file=sys.stderr)
        elif status == ExitStatus.INTERRUPTED:
            message, fix = f"interrupted ({interrupts.describe()})", None
            print(message, file=sys.stderr)
        else:  # Click's usage error: its own "Usage: ... / Error: ..." lines
            exc.show()  # type: ignore[attr-defined]
            message = exc.format_message()  # type: ignore[attr-defined]
            fix = f"see `ceiling {_command_of(args)} --help`".replace("  ", " ")
        _fail(args, message, fix, status, printed, stderr=False)
        return int(status)
    finally:
        interrupts.restore(previous)


def _fail(
    args: list[str], message: str, fix: str | None, code: int, printed: int, stderr: bool = True
) -> None:
    """Say a failure: on stderr (unless already said), and with ``--json`` as one JSON object
    on stdout when the command printed nothing there yet (never two documents)."""
    from ceiling import console
    from ceiling.errors import error_payload

    if stderr:
        print(message, file=sys.stderr)
    if "--json" in args and console.json_documents() == printed:
        console.emit_json(error_payload(message, fix, code))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
