"""The JSON cache of the aiconfigurator adapter: built once per GPU system, then loaded."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from ceiling.predict.tables.build import build_system
from ceiling.predict.tables.core import FIT_VERSION, _cache_dir, info

PARTS = ("fits", "raw_gemm", "raw_moe", "raw_attention", "raw_mla")


def _system_dir(system: str) -> Path | None:
    tinfo = info()
    if tinfo is None or system not in tinfo.systems:
        return None
    return _cache_dir() / f"aic-{tinfo.version}-fit{FIT_VERSION}" / system


def _ensure_built(system: str) -> Path | None:
    """Build the JSON cache of one system once (slow: reads its parquet files)."""
    d = _system_dir(system)
    if d is None:
        return None
    if all((d / f"{part}.json").is_file() for part in PARTS):
        return d
    data = build_system(system)
    raw = data.pop("raw")
    parts = {"fits": data, **{f"raw_{k}": v for k, v in raw.items()}}
    try:
        d.mkdir(parents=True, exist_ok=True)
        for part, value in parts.items():
            tmp = d / f"{part}.json.tmp"
            tmp.write_text(json.dumps(value, separators=(",", ":")))
            tmp.replace(d / f"{part}.json")
    except OSError:  # a read-only home still predicts; it only rebuilds next time
        _MEMORY[system] = parts
    return d


_MEMORY: dict[str, dict[str, Any]] = {}


@cache
def _part(system: str, part: str) -> dict[str, Any] | None:
    if system in _MEMORY:
        return _MEMORY[system].get(part)
    d = _ensure_built(system)
    if d is None:
        return None
    if system in _MEMORY:
        return _MEMORY[system].get(part)
    try:
        return json.loads((d / f"{part}.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def system_fits(system: str) -> dict[str, Any] | None:
    """Kernel fits (and allreduce points) for one aiconfigurator system (cached JSON)."""
    return _part(system, "fits")


def _raw(system: str, family: str) -> dict[str, Any]:
    return _part(system, f"raw_{family}") or {}
