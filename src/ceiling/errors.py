"""One exception type for every expected failure.

Modules raise :class:`CeilingError` with a message that names the problem and a ``fix`` that
names the remedy; the CLI turns it into a one-line error and a non-zero exit code, never a
traceback. Anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations


class CeilingError(Exception):
    """An expected failure: bad input, missing tool, unreachable server, ..."""

    def __init__(self, message: str, fix: str | None = None, exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.message} ({self.fix})" if self.fix else self.message
