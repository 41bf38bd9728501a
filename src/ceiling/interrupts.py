"""Ctrl-C, SIGTERM and SIGHUP: say "stopping ..." at once, unwind, and never abort a teardown.

The CLI routes the three signals to :func:`handle` (``ceiling.cli.main``). The first one prints
``stopping ...`` on stderr and raises :class:`KeyboardInterrupt`, so every ``finally`` runs: a
launched engine is stopped, a partial result is written, and the command exits 130. While a
teardown runs (:func:`shielded`), further signals do not raise (that would abandon the engine
half-stopped); they set :func:`hurry`, and the teardown sends SIGKILL at once instead of waiting.

``ceiling bench`` installs its own handler on its event loop (the first Ctrl-C stops the
measurement and keeps it); it reports the interrupt here with :func:`note`, so that a caller
(``doctor``, ``sweep``) stops its own flow after the bench returns instead of carrying on.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

_state: dict[str, object] = {"signal": None, "hurry": False, "shield": 0, "pending": False}


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _say(text: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def requested() -> int | None:
    """The first interrupting signal received (None: not interrupted)."""
    sig = _state["signal"]
    return sig if isinstance(sig, int) else None


def describe() -> str:
    """``"Ctrl-C"`` / ``"SIGTERM"`` ... for messages and result files."""
    sig = requested()
    if sig is None:
        return "not interrupted"
    return "Ctrl-C" if sig == signal.SIGINT else _name(sig)


def hurry() -> bool:
    """Whether a second signal asked to skip the grace period of a teardown."""
    return bool(_state["hurry"])


def note(signum: int, what: str = "stopping") -> None:
    """Record an interrupt handled elsewhere (bench's event loop) and tell the user at once."""
    if requested() is None:
        _state["signal"] = signum
        _say(f"\n{what} ({describe()}; press Ctrl-C again to stop faster) ...")
    else:
        _state["hurry"] = True


def handle(signum: int, _frame: object) -> None:
    """The CLI's handler for SIGINT/SIGTERM/SIGHUP."""
    if int(_state["shield"]) > 0:  # type: ignore[call-overload]
        if requested() is None:  # first signal, during a teardown: raise once it is done
            _state["signal"], _state["pending"] = signum, True
        if not _state["hurry"]:
            _say(f"\n{_name(signum)}: stopping now, not waiting any longer (SIGKILL) ...")
        _state["hurry"] = True
        return
    if requested() is None:
        _state["signal"] = signum
        _say(f"\nstopping ({describe()}) ...")
    raise KeyboardInterrupt(_name(signum))


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """A teardown that signals must not abort (they make it hurry instead)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state["shield"] = int(_state["shield"]) + 1  # type: ignore[call-overload]
    try:
        yield
    finally:
        _state["shield"] = int(_state["shield"]) - 1  # type: ignore[call-overload]
    if _state["pending"] and int(_state["shield"]) == 0:  # type: ignore[call-overload]
        _state["pending"] = False  # the interrupt that arrived during the teardown
        raise KeyboardInterrupt(describe())


def reset() -> None:
    """Forget a previous interrupt: a run (the CLI, ``flows.doctor.run``) cares about its own."""
    _state.update({"signal": None, "hurry": False, "pending": False})


def install() -> dict[int, object]:
    """Route SIGINT, SIGTERM and SIGHUP to :func:`handle`; returns the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    reset()
    previous: dict[int, object] = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            previous[sig] = signal.signal(sig, handle)
        except (OSError, ValueError):  # pragma: no cover - platform without the signal
            continue
    return previous


def restore(previous: dict[int, object]) -> None:
    """Put back the handlers :func:`install` replaced."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]
