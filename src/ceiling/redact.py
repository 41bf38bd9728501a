"""The one secret redactor: API keys, tokens and URL credentials never reach output or files.

Every text ceiling prints (the consoles, ``emit_json``, error messages) and every JSON it writes
(``console.dumps``: bench results, doctor.json, sweep.json, probe profiles; the sweep ledger;
the reports) passes through :func:`redact`. It removes

- the values of known secrets: the API key from the environment (``CEILING_API_KEY``,
  ``OPENAI_API_KEY``) and every value :func:`register` was given (a variant's ``--api-key``,
  secret-looking variables of a variant's ``env``);
- URL credentials: ``http://user:KEY@host`` -> ``http://***@host``;
- secret-looking query parameters: ``?api_key=X`` / ``&token=X`` -> ``=***``.

Names that look secret (a word ``KEY``, ``TOKEN``, ``SECRET``, ``PASSWORD``, ...) are masked
by :func:`redact_env` (variables) and :func:`redact_argv` (``--api-key X``, ``--hf-token=X``).
Hand-written (regular expressions) because no kept library covers "everything ceiling prints";
the patterns are the URL grammar of RFC 3986 (userinfo ends at the first ``@`` of the authority).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator

#: Words of a name that make it secret (``HF_TOKEN``, ``--api-key``); whole words, so that
#: ``--max-num-batched-tokens`` and ``--tokenizer`` stay readable.
SECRET_WORDS = frozenset(
    {"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS"}
)
#: Environment variables read for the API key, in order (the bench client sends it as a header).
API_KEY_ENV = ("CEILING_API_KEY", "OPENAI_API_KEY")
MASK = "***"
#: Values shorter than this are masked only where they are named as secrets (argv, env), not
#: everywhere: replacing a key "test" in every text would garble "latest" and numbers alike.
MIN_SECRET_LEN = 8

# scheme://userinfo@  (userinfo: no "/", "?", "#", "@" or whitespace before the "@")
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s'\"<>]+)@")
# user:secret@host without a scheme (what a user may pass as --url)
_BARE_USERINFO = re.compile(r"(?<![\w@:.-])[\w.~%+-]+:[^/?#@\s'\"<>]+@(?=[\w\[])")
_QUERY = re.compile(
    r"(?P<name>[?&;](?:api[_-]?key|apikey|key|token|access[_-]?token|auth|password|secret|sig)=)"
    r"(?P<value>[^&;#\s'\"<>]+)",
    re.IGNORECASE,
)
_registered: set[str] = set()
_in_use: list[str] = []


def is_secret_name(name: str) -> bool:
    """Whether a variable or flag name looks like it holds a secret (``HF_TOKEN``, ``--api-key``)."""
    words = re.split(r"[^A-Z0-9]+", name.upper())
    return any(w in SECRET_WORDS for w in words)


def env_api_key() -> str | None:
    """The API key requests carry: the one :func:`use_api_key` set (a launched server's), else
    the environment's (``CEILING_API_KEY``, then ``OPENAI_API_KEY``), or None."""
    if _in_use:
        return _in_use[-1]
    for name in API_KEY_ENV:
        val = os.environ.get(name)
        if val:
            return val
    return None


@contextlib.contextmanager
def use_api_key(key: str | None) -> Iterator[None]:
    """Requests made inside carry ``key`` (the key of a server ceiling launched); None: no
    change. The key is registered as a secret."""
    if not key:
        yield
        return
    register([key])
    _in_use.append(key)
    try:
        yield
    finally:
        _in_use.pop()


def register(values: Iterable[str | None]) -> None:
    """Remember secret values (a variant's ``--api-key``): :func:`redact` masks them from now on."""
    for v in values:
        if v and len(v) >= MIN_SECRET_LEN:
            _registered.add(v)


def _known() -> list[str]:
    key = env_api_key()
    values = set(_registered)
    if key and len(key) >= MIN_SECRET_LEN:
        values.add(key)
    return sorted(values, key=len, reverse=True)  # longest first: no partial masking


def redact(text: str) -> str:
    """``text`` with every known secret value, URL credential and secret query value masked."""
    if not text:
        return text
    for value in _known():
        if value in text:
            text = text.replace(value, MASK)
    if "@" in text:
        text = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
        text = _BARE_USERINFO.sub(f"{MASK}@", text)
    if "=" in text:
        text = _QUERY.sub(lambda m: f"{m['name']}{MASK}", text)
    return text


def holds_secret(value: str) -> bool:
    """Whether a value carries a secret whatever names it: a URL's credentials
    (``https://user:pass@host``), a secret query value, a known key."""
    return redact(value) != value


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Variables with secret-looking names masked; the others redacted like any text."""
    return {k: (MASK if is_secret_name(k) else redact(v)) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
    """The command line with secret-looking flag values masked (``--api-key X``,
    ``--hf-token=X``) and an inline shim script shortened, for files a user keeps."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        name, eq, _value = arg.partition("=")
        secret = arg.startswith("-") and is_secret_name(name)
        if secret and eq:
            out.append(f"{name}={MASK}")
        elif secret:
            out.append(arg)
            mask_next = True
        else:
            out.append(redact(arg) if "\n" not in arg else "<shim>")
    return out
