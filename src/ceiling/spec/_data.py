"""The one reader of the YAML data files that ship inside ceiling (parsed once, cached).

Hardware and model numbers live in ``src/ceiling/data/``; engine tables beside their adapters in
``src/ceiling/engines/data/``, the environment checker's in ``src/ceiling/envcheck/data/``.
Every module reads them through :func:`load_yaml` (LibYAML's C loader when present), each
file against its schema: a :class:`DataModel` (pydantic, ``extra='forbid'``) declared beside
the code that reads it, so that a misspelled or missing key fails at load with the file and the
key named instead of silently becoming a default.
"""

from __future__ import annotations

import difflib
from functools import cache
from importlib import resources
from typing import Any, TypeVar, overload

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from ceiling.errors import CeilingError

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class DataModel(BaseModel):
    """Base of every data file's schema: unknown keys are errors (a typo is not a default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


M = TypeVar("M", bound=BaseModel)


@overload
def load_yaml(relpath: str, folder: str = ..., *, schema: type[M]) -> M: ...
@overload
def load_yaml(
    relpath: str, folder: str = ..., *, schema: type[M], missing_ok: bool
) -> M | None: ...
@overload
def load_yaml(relpath: str, folder: str = ..., missing_ok: bool = ...) -> Any: ...
@cache
def load_yaml(
    relpath: str,
    folder: str = "data",
    missing_ok: bool = False,
    schema: type[BaseModel] | None = None,
) -> Any:
    """Parse ``src/ceiling/<folder>/<relpath>`` (cached: callers must not change the result),
    validated against ``schema`` when given (a CeilingError naming the file and the key when it
    does not match).

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
    data = yaml.load(text, Loader=_LOADER)
    if schema is None:
        return data
    return validate_data(data, schema, f"{folder}/{relpath}")


def validate_data(data: Any, schema: type[M], name: str) -> M:
    """``data`` as ``schema``, or a CeilingError naming the file (``name``) and the first key that
    does not match (unknown, missing or of the wrong type)."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        # an unknown key first: a misspelling shows as one unknown and one missing key, and
        # the unknown one is what the author typed
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        key = ".".join(str(x) for x in first["loc"]) or "(top level)"
        msg = first["msg"]
        if first["type"] == "extra_forbidden":
            parent = first["loc"][:-1]
            missing = [
                str(e["loc"][-1])
                for e in errors
                if e["type"] == "missing" and e["loc"][:-1] == parent and e["loc"]
            ]
            close = difflib.get_close_matches(str(first["loc"][-1]), missing, n=1)
            msg = "unknown key" + (f" (did you mean {close[0]}?)" if close else "")
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise CeilingError(
            f"package data file {name}: {key}: {msg}{more}",
            fix="correct the key in the file (its schema is the model that reads it), "
            "or reinstall ceiling",
        ) from exc
