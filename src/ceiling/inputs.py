"""Input files and output paths, checked before anything expensive runs.

Every file ceiling reads (variants, plans, model configs, logs, result files, datasets) goes
through :func:`read_text`/:func:`read_json`: a missing file, a directory, an unreadable file or
a binary one is a one-line :class:`CeilingError` that names the option and the fix, never a
``UnicodeDecodeError`` traceback. Every output (``--out`` files and directories) is checked by
:func:`check_out_file`/:func:`check_out_dir` before a launch or a request, so a bad path costs a
second, not a 36-minute model load followed by a traceback and nothing saved.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError

from ceiling.errors import CeilingError

M = TypeVar("M", bound=BaseModel)

#: A file whose first bytes hold a NUL is binary (what git and grep assume).
_SNIFF = 8192


#: The most ceiling reads of one input file (a variant, a plan, a config, a result, a log):
#: a path to /dev/zero or a runaway log must not grow the process until the kernel kills it.
MAX_INPUT_BYTES = 256 << 20


@contextlib.contextmanager
def open_regular(
    path: str | Path, what: str, fix: str, max_size: int | None = None
) -> Iterator[BinaryIO]:
    """``path`` opened for reading, proved a regular file: a directory, a device
    (``/dev/zero``), a FIFO (which would block for ever) or a socket is refused before a byte is
    read. The file is opened non-blocking and checked through its descriptor, so a path swapped
    for a FIFO meanwhile cannot hang us either. A file larger than ``max_size`` (None: any size,
    for a caller that bounds what it reads itself) is refused by its size, unread."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise CeilingError(f"{what} not found: {p}", fix=fix) from None
    except IsADirectoryError:
        raise CeilingError(f"{what} {p} is a directory, not a file", fix=fix) from None
    except PermissionError:
        raise CeilingError(f"{what} {p} is not readable (permission denied)", fix=fix) from None
    except OSError as exc:
        raise CeilingError(f"cannot read {what} {p}: {exc.strerror or exc}", fix=fix) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise CeilingError(f"{what} {p} is a directory, not a file", fix=fix)
        if not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
            raise CeilingError(f"{what} {p} is {kind}, not a regular file", fix=fix)
        if max_size is not None and st.st_size > max_size:
            raise too_large(p, what, fix, max_size)
        os.set_blocking(fd, True)
        fh = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with fh:
        yield fh


def too_large(p: str | Path, what: str, fix: str, limit: int) -> CeilingError:
    """The error of an input over its size limit (the limit said in MiB, or bytes if less)."""
    return CeilingError(
        f"{what} {p} is larger than {size_text(limit)}: not a file ceiling reads", fix=fix
    )


def size_text(n: int) -> str:
    """``256 MiB``; a size under 1 MiB in bytes."""
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def read_bytes(path: str | Path, what: str, fix: str, limit: int | None = None) -> bytes:
    """The bytes of ``path``: a regular file (see :func:`open_regular`) of at most ``limit``
    bytes, refused by its size before it is read and bounded while it is read (a file that
    grows meanwhile). ``limit`` defaults to :data:`MAX_INPUT_BYTES`."""
    limit = MAX_INPUT_BYTES if limit is None else limit
    p = Path(path)
    with open_regular(p, what, fix, max_size=limit) as fh:
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise CeilingError(f"cannot read {what} {p}: {exc.strerror or exc}", fix=fix) from None
    if len(data) > limit:
        raise too_large(p, what, fix, limit)
    return data


_KINDS = {
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
}


def read_text(path: str | Path, what: str, fix: str, limit: int | None = None) -> str:
    """The UTF-8 text of ``path``; ``what`` names it in messages ("variant file", "--log").
    See :func:`read_bytes` for what is refused."""
    p = Path(path)
    data = read_bytes(p, what, fix, limit)
    if b"\0" in data[:_SNIFF]:
        raise CeilingError(f"{what} {p} is a binary file, not text", fix=fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CeilingError(
            f"{what} {p} is not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r})",
            fix=fix,
        ) from None


class _NonFinite(ValueError):
    pass


def _no_constant(name: str) -> Any:
    """Python's json reads ``NaN``/``Infinity`` (not JSON): every number after that would be
    poisoned, so such a file is refused where it is read."""
    raise _NonFinite(name)


def read_json(path: str | Path, what: str, fix: str) -> Any:
    """The JSON document in ``path`` (see :func:`read_text`); malformed JSON is one line too."""
    text = read_text(path, what, fix)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except _NonFinite as exc:
        raise CeilingError(
            f"{what} {path} holds {exc}, not a number (JSON has no NaN or infinity)", fix=fix
        ) from None
    except json.JSONDecodeError as exc:
        raise CeilingError(
            f"{what} {path} is not valid JSON (line {exc.lineno}: {exc.msg})", fix=fix
        ) from None
    except RecursionError:
        raise CeilingError(f"{what} {path} is nested too deeply", fix=fix) from None


def _writable_dir(d: Path, option: str) -> None:
    """Create ``d`` (and parents) if needed and prove it takes a new file. ``a/../b`` is
    taken as written (``b``): no folder ``a`` is made on the way."""
    d = Path(os.path.normpath(d))
    if d.exists() and not d.is_dir():
        raise CeilingError(
            f"{option}: {d} exists and is not a directory", fix=f"pass another {option}"
        )
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".ceiling-write-check-", dir=d)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise CeilingError(
            f"{option}: cannot write into {d}: {exc.strerror or exc}",
            fix=f"pass a writable {option} path",
        ) from None


def check_out_file(path: str | Path | None, option: str = "--out") -> None:
    """``path`` can be written as a file: not a directory, its folder exists (or can be made)
    and takes a new file. Device files (``/dev/null``) that exist are accepted as they are."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise CeilingError(f"{option} {p} is a directory", fix=f"name a file, e.g. {p}/run.json")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise CeilingError(f"{option} {p} is not writable", fix=f"pass another {option} file")
        if not p.is_file():
            return  # /dev/null, /dev/stdout, a FIFO: written into, never replaced
    _writable_dir(p.parent if str(p.parent) else Path("."), option)


def check_out_dir(path: str | Path | None, option: str = "--out") -> None:
    """``path`` is (or can be made) a directory that takes new files."""
    if path is None:
        return
    _writable_dir(Path(path), option)


def model_from_options(
    cls: type[M], options: dict[str, Any], command: str, names: dict[str, str] | None = None
) -> M:
    """``cls(**options)`` for a command's options; an out-of-range or malformed value is one
    CeilingError that names the option as the user typed it (``names``: field -> option where
    they differ), never a pydantic traceback."""
    try:
        return cls(**options)
    except ValidationError as err:
        first = err.errors()[0]
        field = str(first["loc"][0]) if first.get("loc") else ""
        option = (names or {}).get(field) or "--" + field.replace("_", "-")
        value = options.get(field, first.get("input"))
        raise CeilingError(
            f"bad {option} {value!r}: {first['msg']}", fix=f"see `ceiling {command} --help`"
        ) from None


def int_list(text: str, option: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``; anything else is one line naming ``option``."""
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise CeilingError(
            f"{option} {text!r} is not a comma-separated list of integers",
            fix=f"e.g. {option} 1,2,4",
        ) from None


def mask_userinfo(url: str) -> str:
    """``url`` with everything between the scheme (or the start) and its LAST ``@`` masked: a
    key with ``/``, spaces or ``@`` in it is hidden whole, even where the URL is malformed."""
    if "@" not in url:
        return url
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    return (scheme + sep if sep else "") + "***@" + rest.rsplit("@", 1)[1]


def base_url(url: str) -> str:
    """Normalize a server URL to its root (``http://h:p``), accepting a trailing ``/v1``."""
    url = url.strip().rstrip("/")
    if "://" not in url:  # host:port alone; another scheme (ftp://) is refused by the checks
        url = "http://" + url
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def check_server_url(url: str, option: str = "--url") -> None:
    """The root of an http(s) server: a host, a valid port, maybe a path prefix (a gateway's);
    no query, fragment, ``@`` outside the credentials, spaces or control characters."""
    try:
        parts = urlsplit(url)
        port, host = parts.port, parts.hostname
    except ValueError:
        parts, port, host = urlsplit(""), -1, None
    bad = any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url)
    bad = bad or "@" in parts.path or bool(parts.query or parts.fragment)
    if bad or parts.scheme not in ("http", "https") or not host or port in (-1, 0):
        shown = mask_userinfo(url)  # a malformed URL may still hold a key
        raise CeilingError(
            f"{option} {shown!r} is not an http(s) server address",
            fix=f"e.g. {option} http://127.0.0.1:8000",
        )
