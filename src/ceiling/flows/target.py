"""The server a doctor examines, over HTTP: is it there, what does it serve.

Plain ``urllib`` (no event loop): a handful of GETs. Each carries the API key the bench client
uses (a key a launched server requires, else ``CEILING_API_KEY``/``OPENAI_API_KEY``); what it
serves, and how a failed ``/v1/models`` is reported, is :mod:`ceiling.bench.served`'s.
"""

from __future__ import annotations

import json

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, ValidationError

from ceiling.bench.served import UNREACHABLE, ServedModel, authorized_request, opener_for
from ceiling.bench.served import served_models as _served_models
from ceiling.engines import get_engine
from ceiling.errors import CeilingError


class LlamaServerProps(BaseModel):
    """What llama-server's ``GET /props`` says of itself (the keys the doctor reads)."""

    model_config = ConfigDict(extra="ignore")

    model_path: str | None = None
    total_slots: int | None = None
    build_info: str | None = None


def server_alive(url: str) -> bool:
    """Whether the server still answers (``/health``, else ``/v1/models``)."""
    for path in ("/health", "/v1/models"):
        try:
            req = authorized_request(url.rstrip("/") + path)
            with opener_for(url).open(req, timeout=5.0) as resp:
                if resp.status == 200:
                    return True
        except UNREACHABLE:
            continue
    return False


def served_models(url: str) -> list[ServedModel]:
    """``/v1/models`` entries; CeilingError when the server is not there."""
    return _served_models(url, timeout_s=5.0, command="doctor")


def server_props(url: str) -> LlamaServerProps | None:
    """llama-server's ``/props`` (None: no such endpoint, or no answer; other engines have none)."""
    try:
        req = authorized_request(url.rstrip("/") + "/props")
        with opener_for(url).open(req, timeout=5.0) as resp:
            return LlamaServerProps.model_validate(json.loads(resp.read().decode()))
    except (*UNREACHABLE, ValidationError):
        return None


def server_version(url: str, path: str, key: str = "version") -> str | None:
    """The version a running server reports (``GET path`` -> ``{key: "0.32.0"}``); None when it
    does not answer or the answer is not a version (the caller then assumes the newest form)."""
    try:
        req = authorized_request(url.rstrip("/") + path)
        with opener_for(url).open(req, timeout=5.0) as resp:
            body = json.loads(resp.read().decode())
    except UNREACHABLE:  # ValueError included: a body that is not JSON
        return None
    got = body.get(key) if isinstance(body, dict) else None
    if not isinstance(got, str):
        return None
    try:
        Version(got)  # an unparsable string would read as version 0 (no profiler at all)
    except InvalidVersion:
        return None
    return got


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
