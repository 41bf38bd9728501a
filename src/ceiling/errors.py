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
                   request failed, the server died mid-run (partial result written), a system
                   error (a full disk, a permission) struck where nothing else handled it
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


#: errno -> the fix of an OSError that reached the CLI unhandled (see :func:`from_os_error`).
_OS_FIXES = {
    errno.ENOSPC: "free some disk space, then run again",
    errno.EDQUOT: "free some space under your disk quota, then run again",
    errno.EACCES: "check the permissions of {path}, or pass a path you can write",
    errno.EPERM: "check the permissions of {path}, or pass a path you can write",
    errno.EROFS: "{path} is on a read-only filesystem: pass a path on a writable one",
    errno.EMFILE: "raise the open-file limit (ulimit -n), then run again",
    errno.ENFILE: "the system is out of file handles: close some programs, then run again",
    errno.ENOMEM: "free some memory, then run again",
    errno.EIO: "the disk reported an I/O error: check it (dmesg), then run again",
}


def _shown(path: object) -> str:
    shown = str(path or "")
    return shown if len(shown) <= 80 else shown[:60] + "..." + shown[-10:]


def from_os_error(exc: BaseException) -> CeilingError | None:
    """An ``OSError`` no module turned into a CeilingError (a full disk, a permission, a file
    limit, wherever it struck), as one: ``None`` for anything else.

    A name the filesystem cannot hold (ENAMETOOLONG: a name over 255 bytes, a path over 4096)
    is a path the user gave: bad input. ``Path.exists()``/``is_file()`` raise it instead of
    answering False wherever a path is looked at, so it is turned into one line here, once.
    Any other is the command failing where it stood (exit 1), named with its path and a fix."""
    if not isinstance(exc, OSError):
        return None
    path = _shown(exc.filename)
    if exc.errno == errno.ENAMETOOLONG:
        return CeilingError(
            f"{path!r}: a path longer than the filesystem allows ({exc.strerror})",
            fix="pass a shorter path (a name is at most 255 bytes)",
        )
    what = exc.strerror or str(exc) or type(exc).__name__
    where = f"{path}: " if path else ""
    if exc.filename2:
        where = f"{path} -> {_shown(exc.filename2)}: "
    fix = _OS_FIXES.get(exc.errno or -1, "check {path} and run again" if path else "run again")
    return CeilingError(
        f"{where}{what}", fix=fix.format(path=path or "the path"), exit_code=ExitStatus.FAILED
    )


def exit_status(exc: BaseException) -> ExitStatus | None:
    """The exit code an exception ends the CLI with; ``None`` for a bug (keep its traceback).

    The one mapping: a :class:`CeilingError` carries its own; an ``OSError`` the code did not
    handle is what :func:`from_os_error` makes of it (a failure, exit 1; a name too long for
    the filesystem, bad input); Click's usage and parameter errors are bad input; an interrupt
    (``KeyboardInterrupt``, Click's ``Abort`` after EOF on a prompt) is 130.
    """
    from typer.exceptions import Abort, TyperException  # Typer's vendored Click errors

    if isinstance(exc, CeilingError):
        return exc.exit_code
    converted = from_os_error(exc)
    if converted is not None:
        return converted.exit_code
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
