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

from pydantic import ValidationError

from ceiling.outputs import cache_dir
from ceiling.predict.tables.build import build_system
from ceiling.predict.tables.core import (
    FIT_VERSION,
    RawTable,
    SystemFits,
    SystemTables,
    info,
)

RAW_PARTS = ("raw_gemm", "raw_moe", "raw_attention", "raw_mla")
PARTS = ("fits", *RAW_PARTS)


class LazyTable(Mapping[str, RawTable]):
    """One raw part of the cache: its keys from the index, a key's rows read on first use."""

    def __init__(self, d: Path, part: str, keys: list[str]) -> None:
        self._d, self._part = d, part
        self._index = {k: i for i, k in enumerate(keys)}
        self._rows: dict[str, RawTable] = {}

    def __getitem__(self, key: str) -> RawTable:
        if key not in self._rows:
            i = self._index[key]  # KeyError for an unknown key, as a dict
            try:
                rows = json.loads((self._d / f"{self._part}.{i}.json").read_text())
            except (OSError, json.JSONDecodeError):
                rows = {}
            self._rows[key] = rows if isinstance(rows, dict) else {}
        return self._rows[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _dumps(value: RawTable | list[str]) -> str:
    return json.dumps(value, separators=(",", ":"))


def _complete(d: Path) -> bool:
    return (d / "fits.json").is_file() and all(
        (d / f"{part}.index.json").is_file() for part in RAW_PARTS
    )


def _system_dir(system: str) -> Path | None:
    tinfo = info()
    if tinfo is None or system not in tinfo.systems:
        return None
    return cache_dir() / f"aic-{tinfo.version}-fit{FIT_VERSION}" / system


def _ensure_built(system: str) -> Path | None:
    """Build the JSON cache of one system once (slow: reads its parquet files)."""
    d = _system_dir(system)
    if d is None:
        return None
    if _complete(d):
        return d
    built = build_system(system)
    try:
        d.mkdir(parents=True, exist_ok=True)
        for part in RAW_PARTS:  # the key files first, each part's index last
            table = built.raw.get(part.removeprefix("raw_")) or {}
            for i, key in enumerate(table):
                _write(d / f"{part}.{i}.json", _dumps(table[key]))
            _write(d / f"{part}.index.json", _dumps(list(table)))
        _write(d / "fits.json", built.fits.model_dump_json())
    except OSError:  # a read-only home still predicts; it only rebuilds next time
        _MEMORY[system] = built
    return d


_MEMORY: dict[str, SystemTables] = {}


@cache
def _fits(system: str) -> SystemFits | None:
    if system not in _MEMORY:
        d = _ensure_built(system)
        if d is None:
            return None
        if system not in _MEMORY:
            try:
                return SystemFits.model_validate_json((d / "fits.json").read_text())
            except (OSError, ValidationError):
                return None
    return _MEMORY[system].fits


@cache
def _part(system: str, part: str) -> Mapping[str, RawTable] | None:
    if system in _MEMORY:
        return _MEMORY[system].raw.get(part.removeprefix("raw_"))
    d = _ensure_built(system)
    if d is None:
        return None
    if system in _MEMORY:
        return _MEMORY[system].raw.get(part.removeprefix("raw_"))
    try:
        keys = json.loads((d / f"{part}.index.json").read_text())
        return LazyTable(d, part, [str(k) for k in keys])
    except (OSError, json.JSONDecodeError):
        return None


def clear_caches() -> None:
    """Forget what was read (tests that build a system of their own)."""
    _fits.cache_clear()
    _part.cache_clear()


def system_fits(system: str) -> SystemFits | None:
    """Kernel fits (and allreduce points) for one aiconfigurator system (cached JSON)."""
    return _fits(system)


def _raw(system: str, family: str) -> Mapping[str, RawTable]:
    return _part(system, f"raw_{family}") or {}
