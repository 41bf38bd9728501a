"""Schemas of the engine tables in ``ceiling/engines/data`` (read through ``spec._data.load_yaml``:
an unknown or missing key fails at load with the file and the key named)."""

from __future__ import annotations

from pydantic import Field

from ceiling.spec._data import DataModel, load_yaml


class RemovedFlag(DataModel):
    """A flag (or a key inside a JSON-valued flag) the engine removed or renamed."""

    removed_in: str
    reason: str
    replacement: str | None
    source: str = ""
    approximate: bool = Field(False, description="the version is a bound, not the release")


class RemovedFlagsFile(DataModel):
    """``<engine>_removed_flags.yaml``."""

    flags: dict[str, RemovedFlag] = Field(default_factory=dict)
    config_keys: dict[str, RemovedFlag] = Field(default_factory=dict)


class DeathRule(DataModel):
    """Why an engine process died: the first rule whose pattern matches its last lines."""

    cause: str
    pattern: str
    fix: str = ""
    engines: list[str] = Field(default_factory=list, description="empty: every engine")


class DeathCausesFile(DataModel):
    """``death_causes.yaml``."""

    rules: list[DeathRule]


class NcclValueRule(DataModel):
    """The values NCCL accepts for one variable (``list``: a comma-separated list of them)."""

    allowed: list[str]
    many: bool = Field(False, alias="list")


class NcclEnvFile(DataModel):
    """``nccl_env.yaml``: NCCL's documented variables, and the values some of them take."""

    variables: list[str]
    values: dict[str, NcclValueRule] = Field(default_factory=dict)


def removed_flags_table(engine: str) -> RemovedFlagsFile:
    """``<engine>_removed_flags.yaml`` (empty when the engine has none)."""
    table = load_yaml(
        f"{engine}_removed_flags.yaml",
        folder="engines/data",
        schema=RemovedFlagsFile,
        missing_ok=True,
    )
    return table if table is not None else RemovedFlagsFile()
