"""What an OpenAI-compatible server serves: ``GET /v1/models``.

Moved to :mod:`ceiling.server` (one URL, credentials and proxy policy for every request):
:meth:`ceiling.server.sync.SyncClient.models` words each failure once, for doctor's target,
trace capture and the sanity checks alike. These names stay for the callers that import them.
"""

from __future__ import annotations

import urllib.request

from ceiling.server.policy import REQUEST_TIMEOUT_S
from ceiling.server.schema import ServedModel
from ceiling.server.sync import UNREACHABLE, SyncClient, opener

__all__ = ["UNREACHABLE", "ServedModel", "authorized_request", "opener_for", "served_models"]


def authorized_request(
    url: str, headers: dict[str, str] | None = None, data: bytes | None = None
) -> urllib.request.Request:
    """A request for the full ``url`` (a POST with ``data``) with the policy's Authorization
    (the API key, or ``user:password@`` in the URL as Basic auth)."""
    return SyncClient(url).request("", data, headers)


def opener_for(url: str) -> urllib.request.OpenerDirector:
    """The opener the policy chooses for ``url`` (loopback: never through a proxy)."""
    return opener(SyncClient(url).target)


def served_models(
    url: str, timeout_s: float = REQUEST_TIMEOUT_S, command: str = "ceiling"
) -> list[ServedModel]:
    """``/v1/models`` entries; CeilingError (exit status SERVER) saying which failure it was.
    ``command`` is the one whose ``--variant FILE`` would launch the server instead."""
    return SyncClient(url, timeout_s=timeout_s).models(command)
