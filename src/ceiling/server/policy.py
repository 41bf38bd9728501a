"""The one policy for reaching a server: its URL, credentials, proxy and timeouts.

Every request ceiling sends takes these decisions from :func:`target` (the sync client, the
aiohttp calls and the bench's own streaming pool alike), so a server answers the same way
whichever command asks. The rules (docs/server.md):

- **Proxy.** A loopback host (``localhost``, ``127.0.0.0/8``, ``::1``) and a server ceiling
  launched itself (``direct=True``) are reached directly: a proxy on this host's environment
  cannot reach our loopback and must never see our server's key. Any other host honours the
  environment's ``HTTP_PROXY``/``HTTPS_PROXY`` (either case) and ``NO_PROXY``, as curl and
  urllib do: a remote server behind a corporate proxy is reachable from every command.
- **Credentials.** ``user:password@`` in the URL becomes ``Authorization: Basic`` (percent
  escapes decoded, RFC 3986) and is stripped from the URL requests go to; the API key (a
  launched server's, else ``CEILING_API_KEY``/``OPENAI_API_KEY``) becomes ``Bearer``. A request
  carries one Authorization header: both at once is an error that says which to drop. The
  password is registered with :mod:`ceiling.redact`, so it never reaches a log or a result.
- **Timeouts.** :data:`CONNECT_TIMEOUT_S` to connect (a wrong URL fails in seconds) and
  :data:`REQUEST_TIMEOUT_S` for a small JSON/text answer; long calls (a completion, a profiler
  start) pass their own total.
"""

from __future__ import annotations

import base64
import ipaddress
import urllib.request
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

from ceiling.errors import CeilingError
from ceiling.inputs import base_url
from ceiling.redact import API_KEY_ENV, env_api_key, register

#: Connecting must fail fast: a wrong URL is an error in seconds, not minutes.
CONNECT_TIMEOUT_S = 4.0
#: A small answer (``/v1/models``, ``/health``, ``/version``, ``/metrics``).
REQUEST_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Target:
    """Where and how requests to one server go.

    ``base``: the server root without credentials (what requests and messages use);
    ``authorization``: the Authorization header value, or None; ``proxy``: the proxy URL
    requests go through, or None (direct).
    """

    base: str
    authorization: str | None
    proxy: str | None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": self.authorization} if self.authorization else {}


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def proxy_for(url: str, direct: bool = False) -> str | None:
    """The proxy a request to ``url`` goes through (None: direct), by the rules above."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if direct or not host or is_loopback(host):
        return None
    proxies = urllib.request.getproxies_environment()  # HTTP_PROXY and http_proxy alike
    proxy = proxies.get(parts.scheme or "http")
    if not proxy:
        return None
    hostport = f"{host}:{parts.port}" if parts.port else host
    # NO_PROXY, read as urllib reads it (suffixes, host:port, "*"); public in the stdlib but
    # missing from typeshed's stubs
    if urllib.request.proxy_bypass_environment(hostport, proxies):  # type: ignore[attr-defined]
        return None
    return proxy if "://" in proxy else "http://" + proxy


def basic_auth(userinfo: str) -> str:
    """``Basic`` header value of a URL's ``user:password`` (percent escapes decoded)."""
    user, _, password = userinfo.partition(":")
    cred = f"{unquote(user)}:{unquote(password)}".encode()
    return "Basic " + base64.b64encode(cred).decode("ascii")


def split_credentials(url: str) -> tuple[str, str | None]:
    """(``url`` without ``user:password@``, that userinfo or None)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, host = parts.netloc.rsplit("@", 1)
    return urlunsplit(parts._replace(netloc=host)), userinfo


def target(
    url: str, *, key: str | None = None, env_key: bool = True, direct: bool = False
) -> Target:
    """The policy applied to ``url``: base URL, Authorization header, proxy.

    ``key``: the API key to send (a launched server's); else, with ``env_key``, the one of
    :func:`ceiling.redact.env_api_key` (the launcher's readiness check sends only its server's
    own key: a 401 then tells the user the variant names none).
    ``direct``: a server ceiling launched (on this host): never through a proxy.
    """
    plain, userinfo = split_credentials(base_url(url))
    key = key or (env_api_key() if env_key else None)
    auth = None
    if userinfo is not None:
        if key:
            raise CeilingError(
                "the server URL carries credentials (user:password@) and an API key is set "
                f"({' / '.join(API_KEY_ENV)}): a request carries only one Authorization header",
                fix="drop the credentials from the URL, or unset the API key variable",
            )
        register([unquote(userinfo.partition(":")[2]), userinfo])
        auth = basic_auth(userinfo)
    elif key:
        auth = f"Bearer {key}"
    return Target(base=plain, authorization=auth, proxy=proxy_for(plain, direct))
