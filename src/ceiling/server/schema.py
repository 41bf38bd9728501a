"""What a server says of itself, as nouns (pydantic, no I/O: the result modules and the flows'
nouns import them without reaching an HTTP client; tests/test_import_contract.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ServedModel(BaseModel):
    """One ``/v1/models`` entry: the name requests use, the checkpoint it was loaded from
    (vLLM's ``root``: a local directory when served from one), the engine that says it owns it."""

    model_config = ConfigDict(extra="ignore")

    id: str
    root: str | None = None
    owned_by: str | None = None
    max_model_len: int | None = Field(None, description="the context it serves (vLLM)")
