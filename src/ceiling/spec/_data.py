"""The one reader of the YAML data files that ship inside ceiling (parsed once, cached).

Hardware and model numbers live in ``src/ceiling/data/``; engine tables beside their adapters in
``src/ceiling/engines/data/``, the environment checker's in ``src/ceiling/envcheck/data/``.
Every module reads them through :func:`load_yaml` (LibYAML's C loader when present).
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml

from ceiling.errors import CeilingError

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def load_yaml(relpath: str, folder: str = "data", missing_ok: bool = False) -> Any:
    """Parse ``src/ceiling/<folder>/<relpath>`` (cached: callers must not change the result).

    A missing file is an error (the install is broken), or None with ``missing_ok`` (optional
    tables, e.g. an engine without a removed-flags file).
    """
    path = resources.files("ceiling").joinpath(*folder.split("/"), *relpath.split("/"))
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        if missing_ok:
            return None
        raise CeilingError(
            f"package data file missing: {folder}/{relpath}", fix="reinstall ceiling"
        ) from exc
    return yaml.load(text, Loader=_LOADER)
