"""Binary extensions that no longer load against the installed torch, found by loading them.

Every Python extension module (a shared object defining ``PyInit_<name>``) of a distribution that
requires torch (engine kernels, flash-attn, torchvision, ...) is imported in a subprocess of the
checked Python, after ``import torch``, under the module name its init function answers to: the
dynamic loader's own message is the evidence, and ``data/load_errors.yaml`` says what it means
(``undefined symbol: _ZN3c10...`` = built against another PyTorch). Plain libraries (no
``PyInit_``) are not loaded on their own: their package loads them its own way (xgrammar loads
``libtvm_ffi`` before its bindings), so a bare dlopen would accuse them falsely.

Kernels an engine ships in several instruction-set builds (vLLM's CPU ``_C``, ``_C_AVX512``,
``_C_AVX2``) are loaded the way the engine loads them: only the build it would import on this
CPU (the adapter's ``kernel_variants``, decided from ``/proc/cpuinfo``); the others are listed as
not loaded, with the reason. A build for instructions this CPU lacks would die by SIGILL, which
says nothing about whether the engine works.

All modules are imported in one process; one that kills the process, or fails other than by the
dynamic loader's refusal, is imported again ALONE in a fresh one, and only a failure there
counts (two extensions that register the same torch op namespace abort one process). A process
killed by a signal is reported by that signal (SIGILL: built for CPU instructions this machine
lacks), not as a load error. Loading imports torch (seconds), so the results are cached per
environment, keyed by the interpreter, every binary's size and mtime, the binaries chosen,
torch's version file and the loader variables (``LD_LIBRARY_PATH``, ``LD_PRELOAD``): a changed
environment is loaded again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
from pathlib import Path

from ceiling.envcheck.binaries import init_function
from ceiling.envcheck.envdata import LoadErrorRule, LoadErrorsFile
from ceiling.envcheck.models import EnvProblem, Inventory, LoadResult, TorchRuntime
from ceiling.envcheck.requirements import pip_cmd, rebuild_cmd
from ceiling.errors import CeilingError
from ceiling.inputs import read_json
from ceiling.outputs import write_cache
from ceiling.spec._data import load_yaml

PROBE = Path(__file__).parent / "data" / "probe_env.py"
_LOADER_VARS = ("LD_LIBRARY_PATH", "LD_PRELOAD")
LOAD_FORMAT = 3  # raise when the choice of binaries or the retry rule changes
# the dynamic loader's own refusals do not depend on what else the process loaded: not retried
_LOADER_FAILURE = re.compile(
    r"undefined symbol|cannot open shared object file|version `\S+' not found"
)


def _rules() -> list[LoadErrorRule]:
    return load_yaml("load_errors.yaml", folder="envcheck/data", schema=LoadErrorsFile).rules


def candidates(inv: Inventory) -> list[tuple[str, str, str]]:
    """(dist name, location, absolute path) of every binary to load; torch's own are skipped
    (``import torch`` loads them, and its failure is reported as such)."""
    out = []
    for d in inv.dists:
        if d.name.lower() == "torch":
            continue
        for rel in d.binaries:
            out.append((d.name, d.location, str(Path(d.location) / rel)))
    return out


def _cache_key(
    python: str, items: list[tuple[str, str, str]], inv: Inventory, skip: dict[str, str]
) -> str:
    h = hashlib.sha256(os.path.realpath(python).encode())
    h.update("|".join(sorted(skip)).encode())  # another CPU picks other builds
    # how binaries are loaded is part of the result: a changed probe or loading rule reloads
    h.update(PROBE.read_bytes())
    h.update(f"load-format-{LOAD_FORMAT}".encode())
    torch_file = (inv.torch or {}).get("path")
    for path in sorted([p for _, _, p in items] + ([torch_file] if torch_file else [])):
        try:
            st = os.stat(path)
            h.update(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode())
        except OSError:
            h.update(f"{path}|missing".encode())
    for var in _LOADER_VARS:
        h.update(f"{var}={os.environ.get(var, '')}".encode())
    return h.hexdigest()[:16]


def load_binaries(
    python: str,
    inv: Inventory,
    cache_dir: Path | None,
    timeout_s: float = 120.0,
    skip: dict[str, str] | None = None,
) -> tuple[TorchRuntime, list[LoadResult], bool]:
    """Load every candidate in the checked Python but those in ``skip`` (absolute path ->
    why the engine does not load it here): (torch's runtime facts, results, from cache)."""
    skip = skip or {}
    items = [it for it in candidates(inv) if it[2] not in skip]
    cache_path = None
    if cache_dir is not None:
        cache_path = cache_dir / "env" / f"load-{_cache_key(python, items, inv, skip)}.json"
        if cache_path.exists():
            try:
                data = read_json(cache_path, "load cache", fix="-")
                return (
                    TorchRuntime.model_validate(data["torch"]),
                    [LoadResult.model_validate(r) for r in data["results"]],
                    True,
                )
            except (CeilingError, ValueError, KeyError, TypeError):
                pass  # a cache that cannot be read is loaded again
    if inv.torch is None and not items:
        return TorchRuntime(), [], False
    args = []
    for _, loc, path in items:
        init = init_function(path)
        if init is None:
            continue
        package = str(Path(path).parent.relative_to(loc)).replace(os.sep, ".").strip(".")
        args.append(f"{package + '.' if package else ''}{init}::{path}")
    runtime, results = _run_load(python, args, timeout_s)
    failed = {r.path for r in results if not r.ok and not _LOADER_FAILURE.search(r.error or "")}
    retry = [a for a in args if a.partition("::")[2] in failed]
    for arg in retry:  # alone, in a fresh process: only that failure counts
        _, alone = _run_load(python, [arg], timeout_s)
        results = [r for r in results if r.path != arg.partition("::")[2]] + alone
    if cache_path is not None:
        doc = {
            "torch": runtime.model_dump(mode="json"),
            "results": [r.model_dump(mode="json") for r in results],
        }
        write_cache(cache_path, json.dumps(doc), what="load cache")
    return runtime, results, False


def _run_load(
    python: str, args: list[str], timeout_s: float
) -> tuple[TorchRuntime, list[LoadResult]]:
    """Run ``probe_env.py load``; a binary that kills the interpreter is reported and skipped."""
    runtime = TorchRuntime()
    results: list[LoadResult] = []
    pending = list(args)
    first = True
    while first or pending:
        proc = subprocess.run(
            [python, str(PROBE), "load", *pending],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        done: set[str] = set()
        for line in proc.stdout.splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if "torch" in obj:
                if first:
                    runtime = TorchRuntime.model_validate(obj["torch"])
            else:
                results.append(LoadResult.model_validate(obj))
                done.add(obj["path"])
        first = False
        rest = [a for a in pending if a.partition("::")[2] not in done]
        if proc.returncode == 0 or not rest:
            break
        # the interpreter died on rest[0]: record how, and go on with the others
        crashed = rest[0].partition("::")[2]
        results.append(LoadResult(path=crashed, ok=False, error=_death(proc)))
        pending = rest[1:]
    return runtime, results


def _death(proc: subprocess.CompletedProcess[str]) -> str:
    """How the probe died: by a signal (named: ``killed by SIGILL``) or with an exit code."""
    tail = (proc.stderr.strip().splitlines() or [""])[-1]
    rc = proc.returncode
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        how = f"the interpreter was killed by {name} loading it"
    else:
        how = f"the interpreter exited with code {rc} loading it"
    return f"{how}: {tail}" if tail else how


def classify(error: str) -> tuple[str, str, str]:
    """(kind, what, fix-template) of a loader message, by the first matching rule."""
    for rule in _rules():
        m = re.search(rule.match, error)
        if m:
            return rule.kind, rule.what.format(*m.groups()), rule.fix
    return "load_error", "does not load", "rebuild"


def load_problems(
    inv: Inventory, results: list[LoadResult], python: str, torch_version: str | None
) -> list[EnvProblem]:
    """One problem per binary that failed, with the fix for its distribution."""
    owner = {path: name for name, _, path in candidates(inv)}
    versions = {d.name: d.version for d in inv.dists}
    problems: list[EnvProblem] = []
    for r in results:
        if r.ok or r.error is None:
            continue
        dist = owner.get(r.path, "?")
        version = versions.get(dist, "")
        kind, what, fix_kind = classify(r.error)
        torch_txt = f"torch {torch_version}" if torch_version else "the installed torch"
        fixes = {
            "rebuild": (
                f"rebuild {dist} against {torch_txt}: "
                + rebuild_cmd(python, dist, version)
                + f"  (or install the torch that {dist} {version} was built for)"
            ),
            "cuda_variant": (
                f"install the {dist} build that matches {torch_txt} (CPU build beside a CPU "
                f"torch), or remove it: {pip_cmd(python, 'uninstall', '-y', dist)}"
            ),
            "library": (
                f"install the library that provides it, or reinstall {dist}: "
                + pip_cmd(python, "install", "--force-reinstall", "--no-deps", f"{dist}=={version}")
            ),
            "system_runtime": (
                "use a newer libstdc++/glibc (a newer OS image or `conda install -c conda-forge "
                f"libstdcxx-ng`), or install a {dist} build made for this system"
            ),
            "cpu_build": (
                f"install a {dist} build made for this CPU's instructions (the flags in "
                "/proc/cpuinfo), or run it on a CPU that has them"
            ),
            "crash": (
                f"reinstall {dist}: "
                + pip_cmd(python, "install", "--force-reinstall", "--no-deps", f"{dist}=={version}")
                + f" (a crash that survives a reinstall is a bug to report to {dist}, with "
                "the signal)"
            ),
        }
        problems.append(
            EnvProblem(
                level="error",
                kind=kind,
                subject=f"{dist} {version}".strip(),
                what=f"{Path(r.path).name} ({dist} {version}) {what}".replace("  ", " "),
                evidence=[r.path, r.error.strip().splitlines()[-1][:400]],
                fix=fixes.get(fix_kind, fixes["rebuild"]),
            )
        )
    return problems
