"""Schemas of the environment checker's data files: ``data/env.yaml`` (CUDA driver minimums,
/dev/shm and open-file rules) and ``envcheck/data/load_errors.yaml`` (binary load failures)."""

from __future__ import annotations

from ceiling.spec._data import DataModel


class ShmRule(DataModel):
    """/dev/shm a TP group uses on one host (NCCL's buffers per connection, an engine's queue)."""

    nccl_buffers_mib_per_connection: float
    nccl_simple_buffer_mib: float
    nccl_connections_per_channel: int
    nccl_channels: int
    engine_queue_mib: int
    recommended_min_mib: int
    safety_factor: float


class NofileRule(DataModel):
    """``ulimit -n``: what a server should have, and below what it fails."""

    target: int
    minimum: int


class EnvFile(DataModel):
    """``data/env.yaml``."""

    schema_version: int
    cuda_drivers: dict[str, str]  # CUDA version -> minimum driver
    minor_compat_min: dict[str, str]  # CUDA major -> minimum driver for minor compatibility
    torch_cuda_tags: list[str]
    torch_index: str
    shm: ShmRule
    nofile: NofileRule


class LoadErrorRule(DataModel):
    """A binary's load failure: the pattern, what it means, which fix."""

    kind: str
    match: str
    what: str
    fix: str


class LoadErrorsFile(DataModel):
    """``envcheck/data/load_errors.yaml``: the first rule whose pattern matches wins."""

    rules: list[LoadErrorRule]
