"""Read the package's YAML data files once (hardware and model numbers live in data, not code)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from ceiling.errors import CeilingError


@cache
def load_yaml(relpath: str) -> Any:
    """Parse ``src/ceiling/data/<relpath>`` (cached; the files ship inside the wheel)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    path = resources.files("ceiling") / "data" / relpath
    try:
        return yaml.load(path.read_text(), Loader=loader)
    except FileNotFoundError as exc:
        raise CeilingError(
            f"package data file missing: data/{relpath}", fix="reinstall ceiling"
        ) from exc
