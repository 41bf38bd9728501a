"""The JSON cache of the aiconfigurator adapter: built once per GPU system, then loaded.

Per system: ``fits.json``, and each raw part (``raw_gemm``, ...) as an index of its table keys
(``<part>.index.json``) plus one small file per key (``<part>.<i>.json``). A prediction reads
a handful of keys (the engine's kernel for each op), so it decodes those files only, not the
whole part (about 1.3 MB of attention rows per system: ~0.2 s of a cold ``predict``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from ceiling.predict.tables.build import build_system
from ceiling.predict.tables.core import FIT_VERSION, _cache_dir, info

RAW_PARTS = ("raw_gemm", "raw_moe", "raw_attention", "raw_mla")
PARTS = ("fits", *RAW_PARTS)


class LazyTable(Mapping[str, Any]):
    """One raw part of the cache: its keys from the index, a key's rows read on first use."""

    def __init__(self, d: Path, part: str, keys: list[str]) -> None:
        self._d, self._part = d, part
        self._index = {k: i for i, k in enumerate(keys)}
        self._rows: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._rows:
            i = self._index[key]  # KeyError for an unknown key, as a dict
            try:
                self._rows[key] = json.loads((self._d / f"{self._part}.{i}.json").read_text())
            except (OSError, json.JSONDecodeError):
                self._rows[key] = {}
        return self._rows[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


def _write(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, separators=(",", ":")))
    tmp.replace(path)


def _complete(d: Path) -> bool:
    return (d / "fits.json").is_file() and all(
        (d / f"{part}.index.json").is_file() for part in RAW_PARTS
    )


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
    if _complete(d):
        return d
    data = build_system(system)
    raw = data.pop("raw")
    parts = {"fits": data, **{f"raw_{k}": v for k, v in raw.items()}}
    try:
        d.mkdir(parents=True, exist_ok=True)
        for part in RAW_PARTS:  # the key files first, each part's index last
            table = parts.get(part) or {}
            for i, key in enumerate(table):
                _write(d / f"{part}.{i}.json", table[key])
            _write(d / f"{part}.index.json", list(table))
        _write(d / "fits.json", data)
    except OSError:  # a read-only home still predicts; it only rebuilds next time
        _MEMORY[system] = parts
    return d


_MEMORY: dict[str, dict[str, Any]] = {}


@cache
def _part(system: str, part: str) -> Mapping[str, Any] | None:
    if system in _MEMORY:
        return _MEMORY[system].get(part)
    d = _ensure_built(system)
    if d is None:
        return None
    if system in _MEMORY:
        return _MEMORY[system].get(part)
    try:
        if part in RAW_PARTS:
            keys = json.loads((d / f"{part}.index.json").read_text())
            return LazyTable(d, part, [str(k) for k in keys])
        return json.loads((d / f"{part}.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def system_fits(system: str) -> dict[str, Any] | None:
    """Kernel fits (and allreduce points) for one aiconfigurator system (cached JSON)."""
    fits = _part(system, "fits")
    return fits if isinstance(fits, dict) else None


def _raw(system: str, family: str) -> Mapping[str, Any]:
    return _part(system, f"raw_{family}") or {}
