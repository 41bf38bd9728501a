"""The server a doctor examines, over HTTP: is it there, what does it serve.

A handful of GETs through :class:`ceiling.server.sync.SyncClient` (no event loop): the same
URL, credentials and proxy policy as every other request (:mod:`ceiling.server.policy`); how a
failed ``/v1/models`` is reported is the client's.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

from ceiling.engines import get_engine
from ceiling.errors import CeilingError
from ceiling.server.schema import ServedModel
from ceiling.server.sync import SyncClient


class LlamaServerProps(BaseModel):
    """What llama-server's ``GET /props`` says of itself (the keys the doctor reads)."""

    model_config = ConfigDict(extra="ignore")

    model_path: str | None = None
    total_slots: int | None = None
    build_info: str | None = None


def server_alive(url: str) -> bool:
    """Whether the server still answers (``/health``, else ``/v1/models``)."""
    return SyncClient(url).alive()


def served_models(url: str) -> list[ServedModel]:
    """``/v1/models`` entries; CeilingError when the server is not there."""
    return SyncClient(url).models(command="doctor")


def server_props(url: str) -> LlamaServerProps | None:
    """llama-server's ``/props`` (None: no such endpoint, or no answer; other engines have none)."""
    body = SyncClient(url).get_json("/props")
    try:
        return LlamaServerProps.model_validate(body) if body is not None else None
    except ValidationError:
        return None


def server_version(url: str, path: str, key: str = "version") -> str | None:
    """The version a running server reports (``GET path`` -> ``{key: "0.32.0"}``); None when it
    does not answer or the answer is not a version (the caller then assumes the newest form)."""
    return SyncClient(url).version(path, key)


def engine_of(entry: ServedModel) -> str | None:
    """The engine a ``/v1/models`` entry names in ``owned_by``, when ceiling knows it (vLLM:
    ``vllm``, llama-server: ``llamacpp``); None for a name that says nothing of the engine
    (llama-cpp-python's server answers ``me``): the start-up log then tells."""
    if not entry.owned_by:
        return None
    try:
        return get_engine(entry.owned_by).name
    except CeilingError:
        return None
