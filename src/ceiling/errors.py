"""One exception type for every expected failure, one enum of exit codes, and the one place
that maps an exception to its exit code.

Modules raise :class:`CeilingError` with a message that names the problem, a ``fix`` that
names the remedy and an :class:`ExitStatus`; the CLI (``ceiling.cli.main``) asks
:func:`exit_status` what any exception means, prints ``error:``/``fix:`` lines (and, with
``--json``, :func:`error_payload` on stdout) and exits with that code, never a traceback.
Anything :func:`exit_status` does not know is a bug and keeps its traceback.
(The pattern of httpie's ``status.ExitStatus`` + ``core.main``: one enum, one mapping.)

Exit codes (docs/failures.md lists what each failure returns and what is kept):

====  ===========  ===============================================================================
code  kind
====  ===========  ===============================================================================
0     ok           success
1     failed       the command ran, and its result is a failure: preflight found errors, every
                   request failed, the server died mid-run (partial result written)
2     input        bad input: an option, an argument, a file (variant, plan, config, log,
                   result) or an output path; nothing was launched or measured (Click's usage
                   errors too)
3     engine       the engine: it died, or was not ready in time
4     server       the server at ``--url``: unreachable, refused the API key, not an
                   OpenAI-compatible API
130   interrupted  Ctrl-C, SIGTERM, SIGHUP: children stopped, what was measured written
====  ===========  ===============================================================================
"""

from __future__ import annotations

import errno
from enum import IntEnum
from typing import Any


class ExitStatus(IntEnum):
    """Every exit code ceiling returns (an ``int``: ``sys.exit(ExitStatus.INPUT)`` exits 2)."""

    OK = 0
    FAILED = 1
    INPUT = 2
    ENGINE = 3
    SERVER = 4
    INTERRUPTED = 130

    @property
    def kind(self) -> str:
        """The lower-case name (``"input"``), the ``kind`` of a JSON error."""
        return self.name.lower()


class CeilingError(Exception):
    """An expected failure: bad input, missing tool, unreachable server, ...

    ``exit_code`` says which kind (default: bad input); it is always an :class:`ExitStatus`.
    """

    def __init__(
        self, message: str, fix: str | None = None, exit_code: ExitStatus = ExitStatus.INPUT
    ) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.exit_code = ExitStatus(exit_code)

    def __str__(self) -> str:
        return f"{self.message} ({self.fix})" if self.fix else self.message


def path_too_long(exc: BaseException) -> CeilingError | None:
    """A path the user gave that the filesystem cannot hold (ENAMETOOLONG: a name over 255
    bytes, a path over 4096) as bad input. ``Path.exists()``/``is_file()`` raise it instead of
    answering False wherever a path is looked at, so it is turned into one line here, once."""
    if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
        shown = str(exc.filename or "")
        shown = shown if len(shown) <= 80 else shown[:60] + "..." + shown[-10:]
        return CeilingError(
            f"{shown!r}: a path longer than the filesystem allows ({exc.strerror})",
            fix="pass a shorter path (a name is at most 255 bytes)",
        )
    return None


def exit_status(exc: BaseException) -> ExitStatus | None:
    """The exit code an exception ends the CLI with; ``None`` for a bug (keep its traceback).

    The one mapping: a :class:`CeilingError` carries its own; Click's usage and parameter
    errors are bad input; an interrupt (``KeyboardInterrupt``, Click's ``Abort`` after EOF on a
    prompt) is 130.
    """
    from typer.exceptions import Abort, TyperException  # Typer's vendored Click errors

    if isinstance(exc, CeilingError):
        return exc.exit_code
    if isinstance(exc, TyperException):  # UsageError, BadParameter, NoSuchOption, FileError
        return ExitStatus.INPUT
    if isinstance(exc, KeyboardInterrupt | Abort):
        return ExitStatus.INTERRUPTED
    return None


def error_payload(message: str, fix: str | None, status: ExitStatus | int) -> dict[str, Any]:
    """The JSON object an error prints on stdout under ``--json`` (besides the stderr lines):
    ``{"error", "fix", "exit_code", "kind"}``."""
    status = ExitStatus(status)
    return {"error": message, "fix": fix, "exit_code": int(status), "kind": status.kind}
