"""Every file ceiling writes goes through :func:`write_atomic`; every name that becomes a file
name through :func:`safe_name`; every path built under an output folder through :func:`inside`.

The rules (docs/failures.md, "What is kept"):

- **Complete or absent.** A regular file is written to a temporary file in the same folder,
  flushed and fsynced, then renamed over the target (and the folder fsynced): a kill, a full
  disk or any write error at any point leaves either the previous file or the new one, never
  half of either. On a write error the temporary file is removed and the CeilingError names the
  path and says what was kept.
- **Never replace a device node.** A path that exists and is not a regular file (``/dev/null``,
  ``/dev/stdout``, a FIFO) is written into, in place: renaming over it would swap a node other
  processes own for a plain file.
- **Never overwrite silently.** A regular file that existed before this process first wrote it
  is kept beside the new one as ``NAME.~N~`` (the next free N, as ``cp --backup=numbered``
  names it), and a note on stderr says so. A file this process already wrote (``doctor.json``
  after each stage, ``sweep.json`` after each trial) is simply replaced.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from pathlib import Path

from ceiling.console import say
from ceiling.errors import CeilingError, ExitStatus

#: Paths (resolved) this process has written: replaced without a kept copy.
_OURS: set[str] = set()
#: Characters kept in a file name; anything else becomes ``_``.
_UNSAFE = re.compile(r"[^A-Za-z0-9._+@=-]")
_NAME_MAX = 120


def safe_name(name: str) -> str:
    """``name`` as one path component: no ``/``, no ``..``, no control characters, no leading
    dot or dash, at most 120 characters; ``"_"`` when nothing is left. Names that are already
    safe (``cpu-tiny``, ``ring_ll.v2``) come back unchanged."""
    text = _UNSAFE.sub("_", name).replace("..", "__")
    text = re.sub(r"^[.-]", "_", text)[:_NAME_MAX]
    return text or "_"


def inside(root: str | Path, path: str | Path, what: str = "output") -> Path:
    """``path`` resolved, proved to lie under ``root`` (resolved; symlinks followed), else a
    CeilingError: nothing is ever written outside the output folder."""
    base = Path(os.path.realpath(root))
    target = Path(os.path.realpath(path))
    if target != base and base not in target.parents:
        raise CeilingError(
            f"{what} {path} would be written outside {root}",
            fix="rename what gives the file its name (no '/', no '..')",
        )
    return target


def _backup_name(path: Path) -> Path:
    n = 1
    while True:
        cand = path.with_name(f"{path.name}.~{n}~")
        if not os.path.lexists(cand):
            return cand
        n += 1


def write_atomic(
    path: str | Path,
    data: str | bytes,
    mode: int | None = None,
    what: str = "file",
    keep_previous: bool = True,
) -> Path:
    """Write ``data`` to ``path`` complete-or-absent (see the module docstring); returns the
    path. ``mode`` (e.g. 0o600 for a file that must hold a secret) is set on the temporary file
    before any byte is written. ``keep_previous=False``: a file that is only ever regenerated
    (a cache, a record) is replaced without a kept copy.

    A failure raises CeilingError (exit 1) naming the path and what was kept."""
    p = Path(path)
    blob = data.encode("utf-8") if isinstance(data, str) else data
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _failed(p, what, exc, existed=False) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise CeilingError(f"cannot write {what} {p}: it is a directory", fix="name a file")
    if st is not None and not stat.S_ISREG(st.st_mode):
        try:  # /dev/null, /dev/stdout, a FIFO: written into, never replaced
            with open(p, "wb") as fh:
                fh.write(blob)
        except OSError as exc:
            raise _failed(p, what, exc, existed=False) from None
        return p
    existed = st is not None
    tmp: str | None = None
    kept: Path | None = None
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name[:60]}.", suffix=".tmp", dir=p.parent)
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode if mode is not None else _default_mode(st))
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        key = os.path.realpath(p)
        if existed and keep_previous and key not in _OURS:
            kept = _backup_name(p)
            try:
                os.link(p, kept)  # the old file stays whole under its new name
            except OSError:  # no hard links here (vfat, some FUSE): copy its bytes instead
                kept = _copy_aside(p)
        os.replace(tmp, p)
        tmp = None
        _fsync_dir(p.parent)
        _OURS.add(key)
    except OSError as exc:
        raise _failed(p, what, exc, existed=existed) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    if kept is not None:
        say(f"note: {p} existed; the previous one is kept as {kept}")
    return p


def write_cache(path: str | Path, data: str | bytes, what: str = "cache") -> Path | None:
    """A file ceiling can always regenerate (a flag table, a load result), written as
    :func:`write_atomic` writes (replaced without a kept copy). A failure to write it (a full
    disk, a read-only home) is a note on stderr and ``None``, never the command's failure: the
    work is done, it is only not remembered."""
    try:
        return write_atomic(path, data, what=what, keep_previous=False)
    except CeilingError as err:
        say(f"note: {err.message}; going on without it")
        return None


def _default_mode(st: os.stat_result | None) -> int:
    """A replaced file keeps its mode; a new one gets 0666 less the umask (what open() gives)."""
    if st is not None:
        return stat.S_IMODE(st.st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _copy_aside(p: Path) -> Path:
    kept = _backup_name(p)
    with open(p, "rb") as src, open(kept, "xb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
        dst.flush()
        os.fsync(dst.fileno())
    return kept


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _failed(p: Path, what: str, exc: OSError, existed: bool) -> CeilingError:
    kept = f"the previous {p.name} is unchanged" if existed else f"{p} was not created"
    return CeilingError(
        f"cannot write {what} {p}: {exc.strerror or exc}; {kept}",
        fix="free some disk space or pass a writable path, then run again",
        exit_code=ExitStatus.FAILED,
    )


def cache_dir() -> Path:
    """ceiling's user cache (``$CEILING_CACHE_DIR``, else ``$XDG_CACHE_HOME/ceiling``, else
    ``~/.cache/ceiling``): engine flag tables, environment checks and predict's table fits."""
    env = os.environ.get("CEILING_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "ceiling"
