"""Terminal output shared by all commands: a Rich console on stderr for humans, JSON on stdout.

Human-readable progress and tables go to stderr so that ``--json`` output on stdout stays
machine-readable even when progress is shown. Everything written here passes through the one
secret redactor (:mod:`ceiling.redact`): the consoles write through :class:`RedactingStream`,
and :func:`dumps` (every JSON ceiling prints or saves) redacts its text.

This is the plumbing of the render layer: a command's result is printed by ``ceiling.render``;
long work anywhere reports itself through :class:`Progress` (a live line on a terminal, plain
lines otherwise). Rich is imported on first use (it costs start-up time).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from functools import cache
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, cast

from ceiling.redact import redact

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID
    from rich.status import Status


class RedactingStream:
    """A text stream that masks secrets (:func:`ceiling.redact.redact`) in what is written to it,
    and otherwise behaves like the stream it wraps (``isatty``, ``fileno``, ``encoding``).
    The stream is looked up on each use (``sys.stderr`` may be replaced, as tests do)."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def _stream(self) -> Any:
        return getattr(sys, self._name)

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@cache
def console() -> Console:
    """The stderr console (imported lazily: Rich costs start-up time)."""
    from rich.console import Console

    return Console(file=cast("IO[str]", RedactingStream("stderr")), highlight=False)


@cache
def out() -> Console:
    """A console on stdout for the human-readable result of a command."""
    from rich.console import Console

    return Console(file=cast("IO[str]", RedactingStream("stdout")), highlight=False)


def _default(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    if hasattr(obj, "__fspath__"):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def dumps(obj: Any, indent: int | None = 2) -> str:
    """JSON text for pydantic models, dataclasses and plain data, with secrets masked."""
    return redact(json.dumps(obj, default=_default, indent=indent, allow_nan=False))


#: JSON documents printed on stdout so far (the CLI prints a JSON error only where the command
#: printed none: stdout never holds two documents)
_emitted = [0]


def emit_json(obj: Any) -> None:
    """Print one JSON document on stdout (the ``--json`` contract of every command)."""
    sys.stdout.write(dumps(obj) + "\n")
    sys.stdout.flush()
    _emitted[0] += 1


def json_documents() -> int:
    """How many JSON documents :func:`emit_json` has printed in this process."""
    return _emitted[0]


class Progress:
    """Long work, said on stderr: on a terminal one live status line (``update`` replaces it);
    without one, nothing, or with ``lines`` a line whenever ``key`` changes (and the current
    text every ``heartbeat_s``), so that a log file shows where the work stands.

    ``with Progress("starting") as p: p.update("loading weights (3 s)", key="loading")``
    """

    def __init__(
        self, text: str, enabled: bool = True, lines: bool = False, heartbeat_s: float = 30.0
    ) -> None:
        self.enabled = enabled
        self.lines = lines
        self.heartbeat_s = heartbeat_s
        self._text = text
        self._status: Status | None = None
        self._last: tuple[str | None, float] = ("", 0.0)  # (key, when) of the last line

    def __enter__(self) -> Progress:
        if self.enabled and console().is_terminal:
            self._status = console().status(_plain(self._text))
            self._status.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def update(self, text: str, key: str | None = None) -> None:
        if self._status is not None:
            self._status.update(_plain(text))
            return
        if not (self.enabled and self.lines):
            return
        now = time.monotonic()
        if key != self._last[0] or now - self._last[1] >= self.heartbeat_s:
            console().print(text, highlight=False, markup=False)
            self._last = (key, now)


class Bars:
    """Progress bars on stderr, one per label (``update(label, done, total)``), gone when the
    work is done; on no terminal, a line every ``heartbeat_s`` seconds instead (the last
    state, or "starting": commbench's ranks take minutes to start), so a log shows where the
    work stands."""

    def __init__(self, what: str, enabled: bool = True, heartbeat_s: float = 5.0) -> None:
        self.what = what
        self.enabled = enabled
        self.heartbeat_s = heartbeat_s
        self._bars: RichProgress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._state = "starting"
        self._stop: threading.Event | None = None

    def _beat(self, stop: threading.Event) -> None:
        t0 = time.monotonic()
        while not stop.wait(self.heartbeat_s):
            say(f"{self.what}: {self._state} ({time.monotonic() - t0:.0f} s)")

    def __enter__(self) -> Bars:
        if not self.enabled:
            return self
        if not console().is_terminal:
            self._stop = threading.Event()
            threading.Thread(target=self._beat, args=(self._stop,), daemon=True).start()
            return self
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.progress import Progress as RichProgress

        self._bars = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console(),
            transient=True,
        )
        self._bars.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bars is not None:
            self._bars.stop()
        if self._stop is not None:
            self._stop.set()

    def update(self, label: str, done: int, total: int) -> None:
        self._state = f"{label} {done}/{total}"
        if self._bars is None:
            return
        if label not in self._tasks:
            self._tasks[label] = self._bars.add_task(f"{self.what} {label}", total=total)
        self._bars.update(self._tasks[label], completed=done)


def _plain(text: str) -> Any:
    """``text`` as Rich text that is never read as markup (``[gpu]`` in a message stays)."""
    from rich.text import Text  # rich loads with the first console (start-up time)

    return Text(text)


def say(text: str) -> None:
    """One plain line on stderr (what ceiling is doing, a note): never markup."""
    console().print(text, highlight=False, markup=False, soft_wrap=True)
