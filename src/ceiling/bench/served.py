"""What an OpenAI-compatible server serves: ``GET /v1/models`` over plain ``urllib``.

Doctor's target, trace capture and the sanity checks ask this one question before anything else
and must say the same thing when it fails: a refused key (HTTP 401/403), a URL that is no
OpenAI API (any other HTTP status), no server at all (refused connection, DNS, a timeout), an
answer that is no model list. Synchronous on purpose: one GET before any event loop exists (the
streaming client's own preflight goes through aiohttp, :mod:`ceiling.bench.client`).
"""

from __future__ import annotations

import base64
import http.client
import json
import urllib.error
import urllib.request
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ceiling.errors import CeilingError, ExitStatus
from ceiling.redact import env_api_key

#: What a failed connection raises (a timeout is an OSError: socket.timeout, TimeoutError).
UNREACHABLE = (urllib.error.URLError, OSError, ValueError, http.client.HTTPException)
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ServedModel(BaseModel):
    """One ``/v1/models`` entry: the name requests use, the checkpoint it was loaded from
    (vLLM's ``root``: a local directory when served from one), the engine that says it owns it."""

    model_config = ConfigDict(extra="ignore")

    id: str
    root: str | None = None
    owned_by: str | None = None
    max_model_len: int | None = Field(None, description="the context it serves (vLLM)")


def authorized_request(
    url: str, headers: dict[str, str] | None = None, data: bytes | None = None
) -> urllib.request.Request:
    """A request (a POST with ``data``) that carries the API key the bench client uses (servers started with
    --api-key); credentials in the URL (``http://user:KEY@host``) become a Basic auth header."""
    key = env_api_key()
    hdrs = dict(headers or {})
    if key:
        hdrs["Authorization"] = f"Bearer {key}"
    parts = urlsplit(url)
    if "@" in parts.netloc:
        userinfo, host = parts.netloc.rsplit("@", 1)
        url = urlunsplit(parts._replace(netloc=host))
        hdrs["Authorization"] = "Basic " + base64.b64encode(userinfo.encode()).decode()
    return urllib.request.Request(url, data=data, headers=hdrs)


def opener_for(url: str) -> urllib.request.OpenerDirector:
    """An opener that never sends a loopback request through the environment's HTTP proxy."""
    loopback = (urlsplit(url).hostname or "") in _LOOPBACK
    return urllib.request.build_opener(*([urllib.request.ProxyHandler({})] if loopback else []))


def served_models(url: str, timeout_s: float = 5.0, command: str = "ceiling") -> list[ServedModel]:
    """``/v1/models`` entries; CeilingError (exit status SERVER) saying which failure it was.
    ``command`` is the one whose ``--variant FILE`` would launch the server instead."""
    url = url.rstrip("/")
    try:
        req = authorized_request(url + "/v1/models")
        with opener_for(url).open(req, timeout=timeout_s) as resp:
            data = json.loads(resp.read().decode())
    except urllib.error.HTTPError as exc:  # before URLError: it is one
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
    except UNREACHABLE as exc:
        raise CeilingError(
            f"no OpenAI-compatible server at {url}: {exc}",
            fix=f"start the server, or pass --variant FILE to let {command} launch it",
            exit_code=ExitStatus.SERVER,
        ) from None
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise CeilingError(
            f"{url}/v1/models did not answer an OpenAI model list",
            fix="pass the server root of an OpenAI-compatible API, e.g. --url http://127.0.0.1:8000",
            exit_code=ExitStatus.SERVER,
        )
    out = []
    for m in entries:  # an entry without a name is no model a request could ask for
        try:
            out.append(ServedModel.model_validate(m))
        except ValidationError:
            continue
    return out
