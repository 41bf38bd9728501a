"""``ceiling env``: is this Python environment (an engine's venv) and this host fit to serve?

Read from what is installed, never from a hard-coded "good set" alone:

1. the inventory, read INSIDE the checked Python by ``data/probe_env.py`` (its own
   importlib.metadata, markers, torch's version file): fast, no torch import;
2. every distribution's requirements against the others (``requirements.py``);
3. every binary of a torch-dependent distribution loaded after ``import torch`` in that Python,
   the loader's message classified (``extensions.py``; cached per environment); of kernels an
   engine ships in several instruction-set builds, only the one it imports on this CPU;
4. NVIDIA driver vs torch's CUDA runtime and the extensions' CUDA runtime, compute capability
   vs compiled architectures, NCCL loaded vs installed (``cuda.py``);
5. ``/dev/shm`` for the planned TP, ``ulimit -n``, hugepage / IOMMU / ACS hints (``host.py``).

The same report is a stage of ``preflight`` (and so of ``doctor``): its problems join the
variant's, an error refuses the launch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from ceiling.console import Progress
from ceiling.engines import all_engines, get_engine
from ceiling.engines.kernels import CpuFeatures, chosen, not_imported
from ceiling.engines.variant import Variant
from ceiling.envcheck import cuda, extensions, host
from ceiling.envcheck.envdata import EnvFile
from ceiling.envcheck.models import EnvProblem, EnvReport, Inventory
from ceiling.envcheck.requirements import check_requirements, pip_cmd
from ceiling.errors import CeilingError
from ceiling.outputs import cache_dir
from ceiling.spec._data import load_yaml


def env_data() -> EnvFile:
    return load_yaml("env.yaml", schema=EnvFile)


def read_inventory(python: str, timeout_s: float = 60.0) -> Inventory:
    """Run ``probe_env.py inventory`` in ``python``; CeilingError when it cannot run."""
    if not Path(python).exists():
        raise CeilingError(
            f"no Python at {python}",
            fix="pass the environment's interpreter, e.g. --python .engines/vllm/bin/python",
        )
    try:
        proc = subprocess.run(
            [python, str(extensions.PROBE), "inventory"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except OSError as exc:
        raise CeilingError(f"cannot run {python}: {exc.strerror}", fix="check the path") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CeilingError(
            f"{python} could not list its packages: {last}",
            fix="check that this interpreter starts (`PY -c 'import importlib.metadata'`)",
        )
    return Inventory.model_validate(json.loads(proc.stdout))


def _engines(inv: Inventory) -> list[Any]:
    names = {canonicalize_name(d.name) for d in inv.dists}
    return [e for e in all_engines() if any(canonicalize_name(n) in names for n in e.dist_names)]


def check_environment(
    python: str,
    tp: int = 1,
    shm_root: Path = Path("/dev/shm"),
    use_cache: bool = True,
    nofile: tuple[int, int] | None = None,
    variant_env: dict[str, str] | None = None,
    cpu: CpuFeatures | None = None,
) -> EnvReport:
    """Every check on ``python``'s environment and this host (see the module docstring);
    ``cpu``: the CPU whose builds are loaded (default: this one)."""
    t0 = time.monotonic()
    report = check_python(python, use_cache=use_cache, cpu=cpu)
    add_host_checks(report, tp, shm_root, nofile, variant_env)
    report.elapsed_s = round(time.monotonic() - t0, 3)
    return report


def check_python(python: str, use_cache: bool = True, cpu: CpuFeatures | None = None) -> EnvReport:
    """Steps 1-4: the environment of ``python`` and the GPU stack it meets on this host
    (``cpu``: the CPU the engines' kernel builds are chosen for; default: this one)."""
    data = env_data()
    inv = read_inventory(python)
    torch_facts = inv.torch or {}
    report = EnvReport(
        python=python,
        python_version=inv.version,
        torch_version=torch_facts.get("version"),
        torch_cuda=torch_facts.get("cuda"),
        dists_checked=len(inv.dists),
    )
    engines = _engines(inv)
    report.engines = [e.name for e in engines]
    waived: dict[str, str] = {}
    for e in engines:
        waived.update(e.env_waivers(report.torch_version))

    report.checks.append("requirements")
    report.problems.extend(check_requirements(inv, python, waived))

    report.checks.append("binaries")
    skip = _not_imported(inv, engines, cpu or host.cpu_features(), report.notes)
    runtime, results, cached = extensions.load_binaries(
        python, inv, cache_dir() if use_cache else None, skip=skip
    )
    report.torch_runtime = runtime
    report.binaries_checked = len(results)
    report.binaries_cached = cached
    if inv.torch is not None and runtime.error:
        kind, what, _ = extensions.classify(runtime.error)
        report.problems.append(
            EnvProblem(
                level="error",
                kind=f"torch_{kind}",
                subject=f"torch {report.torch_version}",
                what=f"`import torch` fails: {what}",
                evidence=[runtime.error[:400]],
                fix=pip_cmd(
                    python, "install", "--force-reinstall", f"torch=={report.torch_version}"
                ),
            )
        )
    report.problems.extend(extensions.load_problems(inv, results, python, report.torch_version))

    report.checks.append("cuda")
    report.driver = cuda.read_driver()
    report.gpus = cuda.read_gpus()
    if report.driver.cuda is None and not report.gpus:
        report.notes.append(
            "no NVIDIA driver on this host: driver, architecture and NCCL checks skipped"
        )
    report.problems.extend(
        cuda.check_runtime(python, report.torch_cuda, report.torch_version, report.driver, data)
    )
    report.problems.extend(
        cuda.check_binaries(
            python, inv, runtime, report.driver, report.gpus, extensions.candidates(inv)
        )
    )
    report.problems.extend(cuda.check_nccl(python, inv, runtime))
    _sort(report)
    return report


def _not_imported(
    inv: Inventory, engines: list[Any], cpu: CpuFeatures, notes: list[str]
) -> dict[str, str]:
    """The engines' kernel builds they do not import on ``cpu`` (absolute path -> why), so
    not loaded; a note per engine says which build is loaded and why."""
    skip: dict[str, str] = {}
    for e in engines:
        names = {canonicalize_name(n) for n in e.dist_names}
        for d in inv.dists:
            if canonicalize_name(d.name) not in names:
                continue
            for variants in e.kernel_variants:
                skipped, picked = not_imported(variants, d.binaries, cpu)
                if not skipped:
                    continue
                for rel, why in skipped.items():
                    skip[str(Path(d.location) / rel)] = why
                pick, why = chosen(variants, cpu)
                imports = f"imports {variants.package}.{pick}" if pick else "imports none"
                notes.append(
                    f"{d.name} {d.version}: {', '.join(sorted(Path(r).name for r in skipped))} "
                    f"not loaded: {e.display_name or e.name} {imports} on this CPU ({why})"
                    + (f", loaded {Path(picked).name}" if picked else "")
                )
    return skip


def add_host_checks(
    report: EnvReport,
    tp: int,
    shm_root: Path = Path("/dev/shm"),
    nofile: tuple[int, int] | None = None,
    variant_env: dict[str, str] | None = None,
) -> None:
    """Step 5: /dev/shm for ``tp`` ranks (with the variant's NCCL buffer settings), open files,
    peer-to-peer hints."""
    data = env_data()
    report.tp = tp
    report.checks.append("host")
    report.problems.extend(host.check_shm(shm_root, tp, data, variant_env or {}))
    report.problems.extend(host.check_nofile(data.nofile, nofile))
    hints, facts = host.check_p2p_hints(gpus=len(report.gpus))
    report.problems.extend(hints)
    report.notes.extend(facts)
    _sort(report)


def _sort(report: EnvReport) -> None:
    order = {"error": 0, "warning": 1, "info": 2}
    report.problems.sort(key=lambda p: order[p.level])


@cache
def _cached_python(python: str) -> EnvReport:
    return check_python(python)


def check_for_preflight(
    python: str, tp: int, variant_env: dict[str, str]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``preflight``'s environment stage: (the report's summary without its problems, the
    warnings and errors as preflight problems, ``kind`` prefixed ``env:``). The environment part
    is checked once per interpreter in a process (a sweep plan of many variants on one engine
    pays it once); the host part follows each variant's TP and NCCL settings."""
    report = _cached_python(os.path.abspath(python)).model_copy(deep=True)
    add_host_checks(report, tp, variant_env=variant_env)
    summary = {k: v for k, v in report.summary().items() if k != "problems"}
    found = [
        {
            "level": p.level,
            "kind": f"env:{p.kind}",
            "subject": p.subject,
            "message": p.what,
            "fix": p.fix,
        }
        for p in report.problems
        if p.level != "info"
    ]
    return summary, found


def env_report(
    python: str | None,
    tp: int,
    shm_root: Path,
    refresh: bool,
    engine: str | None = None,
    progress: bool = True,
) -> EnvReport:
    """``ceiling env``: the report on ``python`` (default: ``engine``'s environment, as launch
    finds it, else this Python); ``report.ok`` is False when any problem is an error."""
    if not 1 <= tp <= 4096:  # checked before any interpreter is started
        raise CeilingError(f"--tp {tp} is not a tensor-parallel size", fix="e.g. --tp 8")
    if not str(shm_root).strip() or not Path(shm_root).is_dir():
        raise CeilingError(
            f"--shm-root {shm_root} is not a directory", fix="the shared-memory mount: /dev/shm"
        )
    python = python or _default_python(engine)
    with Progress(f"checking {python}", enabled=progress):
        return check_environment(python, tp=tp, shm_root=shm_root, use_cache=not refresh)


def _default_python(engine: str | None) -> str:
    """``--engine NAME``: that engine's environment (as launch finds it); else this Python."""
    if engine is None:
        return sys.executable
    adapter = get_engine(engine)
    install = adapter.locate(Variant(name="env", engine=adapter.name, model="-"))
    if install.python is None:
        raise CeilingError(
            f"{engine} runs as a command here, not from a Python environment",
            fix="pass --python PATH of the environment to check",
        )
    return str(install.python)
