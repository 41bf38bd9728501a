"""The server a doctor examines, over HTTP: is it there, what does it serve.

Plain ``urllib`` (no event loop): a handful of GETs. Each carries the API key the bench client
uses (a key a launched server requires, else ``CEILING_API_KEY``/``OPENAI_API_KEY``).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any

from ceiling.errors import CeilingError, ExitStatus


def _request(url: str) -> urllib.request.Request:
    """A GET that carries the API key the bench client uses (servers started with --api-key);
    credentials in the URL (``http://user:KEY@host``) become a Basic auth header."""
    import base64
    from urllib.parse import urlsplit, urlunsplit

    from ceiling.bench.client import api_key

    key = api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    parts = urlsplit(url)
    if "@" in parts.netloc:
        userinfo, host = parts.netloc.rsplit("@", 1)
        url = urlunsplit(parts._replace(netloc=host))
        headers["Authorization"] = "Basic " + base64.b64encode(userinfo.encode()).decode()
    return urllib.request.Request(url, headers=headers)


def _http_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(_request(url), timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def server_alive(url: str) -> bool:
    """Whether the server still answers (``/health``, else ``/v1/models``)."""
    for path in ("/health", "/v1/models"):
        try:
            with urllib.request.urlopen(_request(url.rstrip("/") + path), timeout=5.0) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
            continue
    return False


def served_models(url: str) -> list[dict[str, Any]]:
    """``/v1/models`` entries (id, root, owned_by); CeilingError when the server is not there."""
    try:
        data = _http_json(url.rstrip("/") + "/v1/models")
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise CeilingError(
                f"{url}/v1/models refused the request (HTTP {exc.code}): it needs an API key",
                fix="set CEILING_API_KEY (or OPENAI_API_KEY) to the server's API key",
                exit_code=ExitStatus.SERVER,
            ) from None
        raise CeilingError(
            f"no OpenAI-compatible API at {url} (GET /v1/models: HTTP {exc.code})",
            fix="pass the server root, e.g. --url http://127.0.0.1:8000",
            exit_code=ExitStatus.SERVER,
        ) from None
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        raise CeilingError(
            f"no OpenAI-compatible server at {url}: {exc}",
            fix="start the server, or pass --variant FILE to let doctor launch it",
            exit_code=ExitStatus.SERVER,
        ) from None
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise CeilingError(
            f"{url}/v1/models did not answer an OpenAI model list",
            fix="pass the server root of an OpenAI-compatible API, e.g. --url http://127.0.0.1:8000",
            exit_code=ExitStatus.SERVER,
        )
    return [m for m in entries if isinstance(m, dict)]
