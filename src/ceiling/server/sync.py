"""The synchronous client (``urllib``): a handful of calls before any event loop exists, or
from threads (doctor's target, sanity, trace capture, the launcher's and ``ceiling ready``'s
readiness polls). URL, credentials, proxy and timeouts are :mod:`ceiling.server.policy`'s.

The endpoints: :meth:`SyncClient.models` (``GET /v1/models``, each failure worded once),
:meth:`~SyncClient.health`/:meth:`~SyncClient.alive` (readiness), :meth:`~SyncClient.version`,
:meth:`~SyncClient.metrics`, :meth:`~SyncClient.profiler` (start/stop calls).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from typing import Any

from packaging.version import InvalidVersion, Version
from pydantic import ValidationError

from ceiling.errors import CeilingError, ExitStatus
from ceiling.redact import redact
from ceiling.server.policy import REQUEST_TIMEOUT_S, Target, target
from ceiling.server.schema import ServedModel

#: What a failed connection raises (a timeout is an OSError: socket.timeout, TimeoutError;
#: ValueError: a body that is no JSON, or a URL urllib cannot parse).
UNREACHABLE = (urllib.error.URLError, OSError, ValueError, http.client.HTTPException)


def opener(tgt: Target) -> urllib.request.OpenerDirector:
    """An opener that sends through ``tgt.proxy`` or, when None, directly: an empty
    ProxyHandler, since urllib's default one reads HTTP(S)_PROXY itself, whatever the host."""
    scheme = tgt.base.split("://", 1)[0]
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({scheme: tgt.proxy} if tgt.proxy else {})
    )


class SyncClient:
    """Requests to one server (``url`` may carry ``user:password@``), by the one policy.

    ``key``/``env_key``/``direct``: see :func:`ceiling.server.policy.target`.
    """

    def __init__(
        self,
        url: str,
        *,
        key: str | None = None,
        env_key: bool = True,
        direct: bool = False,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.target = target(url, key=key, env_key=env_key, direct=direct)
        self.base = self.target.base
        self.timeout_s = timeout_s
        self._opener = opener(self.target)

    def request(
        self, path: str, data: bytes | None = None, headers: dict[str, str] | None = None
    ) -> urllib.request.Request:
        """A request for ``path`` (a POST with ``data``) carrying the policy's Authorization."""
        hdrs = {**(headers or {}), **self.target.headers}
        return urllib.request.Request(self.base + path, data=data, headers=hdrs)

    def open(
        self,
        path: str,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """The response (a context manager; raises HTTPError and the UNREACHABLE errors)."""
        req = self.request(path, data, headers)
        return self._opener.open(req, timeout=timeout_s or self.timeout_s)

    def get(self, path: str, timeout_s: float | None = None) -> tuple[int | None, bytes | None]:
        """(HTTP status, body) of ``GET path``; (status, None) for an error status;
        (None, None): no answer."""
        try:
            with self.open(path, timeout_s=timeout_s) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:  # before URLError: it is one
            return exc.code, None
        except UNREACHABLE:
            return None, None

    def post_json(
        self, path: str, body: dict[str, Any], timeout_s: float = 120.0
    ) -> tuple[int, str, float]:
        """POST ``body``: (status, first 2000 characters of the answer, seconds). An error
        status is returned; no answer at all is a CeilingError."""
        t0 = time.monotonic()
        hdrs = {"Content-Type": "application/json"}
        try:
            with self.open(path, json.dumps(body).encode(), hdrs, timeout_s) as resp:
                return resp.status, resp.read(2000).decode(errors="replace"), time.monotonic() - t0
        except urllib.error.HTTPError as exc:
            text = exc.read(2000).decode(errors="replace") if exc.fp else ""
            return exc.code, text, time.monotonic() - t0
        except UNREACHABLE as exc:
            raise CeilingError(
                f"{self.base + path} did not answer ({redact(str(exc))})",
                fix="check that the server is running and the URL",
            ) from exc

    # -- endpoints -------------------------------------------------------------------------
    def models(self, command: str = "ceiling") -> list[ServedModel]:
        """``/v1/models`` entries; CeilingError (exit status SERVER) saying which failure it
        was: a refused key, a URL that is no OpenAI API, no server, an answer that is no model
        list. ``command`` is the one whose ``--variant FILE`` would launch the server instead."""
        url = self.base
        try:
            with self.open("/v1/models") as resp:
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
                f"no OpenAI-compatible server at {url}: {redact(str(exc))}",
                fix=f"start the server, or pass --variant FILE to let {command} launch it",
                exit_code=ExitStatus.SERVER,
            ) from None
        entries = data.get("data") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            raise CeilingError(
                f"{url}/v1/models did not answer an OpenAI model list",
                fix="pass the server root of an OpenAI-compatible API, e.g. "
                "--url http://127.0.0.1:8000",
                exit_code=ExitStatus.SERVER,
            )
        out = []
        for m in entries:  # an entry without a name is no model a request could ask for
            try:
                out.append(ServedModel.model_validate(m))
            except ValidationError:
                continue
        return out

    def health(self, path: str = "/health", timeout_s: float | None = None) -> bool:
        """Whether ``GET path`` answers 200 (a readiness poll)."""
        return self.get(path, timeout_s)[0] == 200

    def alive(self) -> bool:
        """Whether the server still answers (``/health``, else ``/v1/models``)."""
        return any(self.health(p) for p in ("/health", "/v1/models"))

    def get_json(self, path: str) -> Any:
        """The JSON body of ``GET path`` (None: no answer, an error status or no JSON)."""
        status, body = self.get(path)
        if status != 200 or body is None:
            return None
        try:
            return json.loads(body.decode())
        except ValueError:
            return None

    def version(self, path: str, key: str = "version") -> str | None:
        """The version a running server reports (``GET path`` -> ``{key: "0.32.0"}``); None
        when it does not answer or the answer is no version (the caller then assumes the
        newest form)."""
        body = self.get_json(path)
        got = body.get(key) if isinstance(body, dict) else None
        if not isinstance(got, str):
            return None
        try:
            Version(got)  # an unparsable string would read as version 0 (no profiler at all)
        except InvalidVersion:
            return None
        return got

    def metrics(self, timeout_s: float = 10.0) -> str | None:
        """The server's ``/metrics`` text (None: none served, or no answer)."""
        status, body = self.get("/metrics", timeout_s)
        return body.decode(errors="replace") if status == 200 and body is not None else None

    def profiler(
        self, path: str, body: dict[str, Any] | None = None, timeout_s: float = 120.0
    ) -> tuple[int, str, float]:
        """A profiler start or stop call (the engine's path, e.g. ``/start_profile``):
        (status, answer text, seconds); CeilingError when the server does not answer."""
        return self.post_json(path, body or {}, timeout_s)


def served_models(
    url: str, timeout_s: float = REQUEST_TIMEOUT_S, command: str = "ceiling"
) -> list[ServedModel]:
    """``/v1/models`` entries of the server at ``url`` (:meth:`SyncClient.models`); ``command``
    is the one whose ``--variant FILE`` would launch the server instead."""
    return SyncClient(url, timeout_s=timeout_s).models(command)
