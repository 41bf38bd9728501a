"""One exception type for every expected failure, and one exit code per kind of failure.

Modules raise :class:`CeilingError` with a message that names the problem and a ``fix`` that
names the remedy; the CLI turns it into a one-line error and a non-zero exit code, never a
traceback. Anything else that escapes is a bug and keeps its traceback.

Exit codes (docs/failures.md lists what each failure returns and what is kept):

====  ==========================================================================================
0     success
1     the command ran, and its result is a failure: preflight found errors, every request
      failed, the server died mid-run (partial result written)
2     bad input: an option, an argument, a file (variant, plan, config, log, result) or an
      output path; nothing was launched or measured (Click's usage errors are 2 as well)
3     the engine: it died, or was not ready in time
4     the server at ``--url``: unreachable, refused the API key, not an OpenAI-compatible API
130   interrupted (Ctrl-C, SIGTERM, SIGHUP): children stopped, what was measured written
====  ==========================================================================================
"""

from __future__ import annotations

EXIT_FAILED = 1
EXIT_INPUT = 2
EXIT_ENGINE = 3
EXIT_SERVER = 4
EXIT_INTERRUPTED = 130


class CeilingError(Exception):
    """An expected failure: bad input, missing tool, unreachable server, ..."""

    def __init__(self, message: str, fix: str | None = None, exit_code: int = EXIT_INPUT) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.message} ({self.fix})" if self.fix else self.message
