"""Every installed distribution's declared requirements against what is installed beside it.

The same rule ``pip check`` applies (requirements of extras are not checked), evaluated with
``packaging`` against the markers of the CHECKED interpreter (read there by probe_env.py), so
that a venv of another Python version is judged by its own markers. Also caught: a distribution
installed twice on the path (two ``dist-info`` of one name: whichever is first wins at import).
"""

from __future__ import annotations

import shlex

from packaging.markers import InvalidMarker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ceiling.envcheck.models import Dist, EnvProblem, Inventory


def pip_cmd(python: str, *args: str) -> str:
    """``PY -m pip ARGS`` quoted for a shell (the fix a user pastes)."""
    return " ".join(shlex.quote(a) for a in (python, "-m", "pip", *args))


def rebuild_cmd(python: str, dist: str, version: str | None) -> str:
    """Reinstall ``dist`` from source against what is installed now (an extension built for
    another torch or another GPU): no deps, no cache, no build isolation."""
    spec = f"{dist}=={version}" if version else dist
    return pip_cmd(
        python,
        "install",
        "--force-reinstall",
        "--no-deps",
        "--no-cache-dir",
        "--no-build-isolation",
        spec,
    )


def check_requirements(
    inv: Inventory, python: str, waived: dict[str, str] | None = None
) -> list[EnvProblem]:
    """Missing and conflicting requirements, and duplicate installs, in ``inv``.

    ``waived``: canonical dist name -> why its absence is intended (an engine adapter's word,
    e.g. vLLM's CPU build without CUDA torchvision); such a missing requirement is ``info``.
    """
    waived = waived or {}
    problems: list[EnvProblem] = []
    installed: dict[str, Dist] = {}
    seen: dict[str, list[Dist]] = {}
    for d in inv.dists:
        key = canonicalize_name(d.name)
        seen.setdefault(key, []).append(d)
        installed.setdefault(key, d)  # the first on sys.path is the one imported
    for _key, copies in sorted(seen.items()):
        versions = sorted({c.version for c in copies})
        if len(copies) > 1 and len(versions) > 1:
            # copies in different sys.path entries are an overlay (a staged site directory on
            # PYTHONPATH over the base image): imports get the first, as meant; two in one
            # directory are a broken install
            overlay = len({c.location for c in copies}) == len(copies)
            problems.append(
                EnvProblem(
                    level="warning" if overlay else "error",
                    kind="duplicate_install",
                    subject=copies[0].name,
                    what=(
                        f"{copies[0].name} is installed {len(copies)} times ({', '.join(versions)}); "
                        f"imports get {copies[0].version}, metadata checks may read another"
                    ),
                    evidence=[f"{c.name} {c.version} in {c.location}" for c in copies],
                    fix=pip_cmd(python, "uninstall", "-y", copies[0].name)
                    + " (repeat until none is left), then "
                    + pip_cmd(python, "install", f"{copies[0].name}=={copies[0].version}"),
                )
            )
    env = dict(inv.markers)
    for d in inv.dists:
        for raw in d.requires:
            try:
                req = Requirement(raw)
            except InvalidRequirement:
                continue
            if req.marker is not None:
                try:
                    if not req.marker.evaluate({**env, "extra": ""}):
                        continue
                except InvalidMarker:
                    continue
            problem = _check_one(d, req, raw, installed, python, waived)
            if problem is not None:
                problems.append(problem)
    return problems


def _check_one(
    d: Dist,
    req: Requirement,
    raw: str,
    installed: dict[str, Dist],
    python: str,
    waived: dict[str, str],
) -> EnvProblem | None:
    key = canonicalize_name(req.name)
    have = installed.get(key)
    spec = str(req.specifier)
    wanted = f"{req.name}{spec}"
    if have is None:
        if key in waived:
            return EnvProblem(
                level="info",
                kind="missing_requirement_intended",
                subject=req.name,
                what=f"{d.name} {d.version} requires {wanted}, absent on purpose: {waived[key]}",
                evidence=[f"{d.name} {d.version}: Requires-Dist: {raw}"],
            )
        return EnvProblem(
            level="warning",
            kind="missing_requirement",
            subject=req.name,
            what=f"{d.name} {d.version} requires {wanted}, which is not installed",
            evidence=[f"{d.name} {d.version}: Requires-Dist: {raw}"],
            fix=pip_cmd(python, "install", wanted),
        )
    if not spec:
        return None
    try:
        version = Version(have.version)
    except InvalidVersion:
        return None
    if req.specifier.contains(version, prereleases=True):
        return None
    # A requirement on torch is the one that decides whether compiled extensions still load:
    # an error. Other version conflicts often still work: a warning.
    level = "error" if key == "torch" else "warning"
    return EnvProblem(
        level=level,
        kind="requirement_conflict",
        subject=req.name,
        what=(
            f"{d.name} {d.version} requires {wanted}, but {have.name} {have.version} is installed"
        ),
        evidence=[
            f"{d.name} {d.version}: Requires-Dist: {raw}",
            f"installed: {have.name} {have.version} in {have.location}",
        ],
        fix=(
            f"{pip_cmd(python, 'install', wanted)}  (or install the {d.name} release that "
            f"matches {have.name} {have.version})"
        ),
    )
