"""Kernel extensions an engine ships in several instruction-set builds, of which it imports one.

vLLM's CPU wheel carries ``_C`` (AVX-512 + BF16), ``_C_AVX512`` and ``_C_AVX2``: the engine
picks one at start-up from the CPU's features and never touches the others. A binary built for
instructions this CPU lacks dies by SIGILL when loaded, so the environment check must load only
the build the engine would pick here (``ceiling.envcheck``), deciding from the same features.
The adapter states the choice as data (``Engine.kernel_variants``); :func:`chosen` and
:func:`not_imported` apply it.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from pydantic import BaseModel, Field


class CpuFeatures(BaseModel, frozen=True):
    """This CPU as the kernel reports it: ``platform.machine()`` and ``/proc/cpuinfo`` flags."""

    machine: str
    flags: frozenset[str] = Field(default_factory=frozenset)


class KernelBuild(BaseModel, frozen=True):
    """One build of the kernels: its module file's stem (``_C_AVX2``) and the CPU flags (as
    ``/proc/cpuinfo`` names them) the engine requires before importing it."""

    module: str
    needs: tuple[str, ...] = ()


class KernelVariants(BaseModel, frozen=True):
    """Builds of one extension in ``package``; on ``machines`` the engine imports the first
    build whose ``needs`` this CPU has, elsewhere ``elsewhere`` (None: none of them)."""

    package: str
    machines: tuple[str, ...]
    builds: tuple[KernelBuild, ...]
    elsewhere: str | None = None

    def modules(self) -> set[str]:
        return {b.module for b in self.builds} | ({self.elsewhere} if self.elsewhere else set())


def chosen(variants: KernelVariants, cpu: CpuFeatures) -> tuple[str | None, str]:
    """(the module the engine imports on ``cpu``, why), following the engine's own order."""
    if cpu.machine.lower() not in variants.machines:
        return variants.elsewhere, f"{cpu.machine} is not {'/'.join(variants.machines)}"
    passed: list[str] = []
    for build in variants.builds:
        missing = [f for f in build.needs if f not in cpu.flags]
        if not missing:
            if build.needs:
                return build.module, f"this CPU has {', '.join(build.needs)}"
            return build.module, f"this CPU lacks what {' and '.join(passed)} need"
        passed.append(build.module)
    return None, "this CPU has the features of none of the builds"


def _module_of(relpath: str, package: str) -> str | None:
    """``vllm/_C_AVX2.abi3.so`` -> ``_C_AVX2`` when it sits directly in ``package``."""
    p = PurePosixPath(relpath.replace("\\", "/"))
    if str(p.parent).replace("/", ".") != package:
        return None
    return p.name.split(".", 1)[0]


def not_imported(
    variants: KernelVariants, relpaths: list[str], cpu: CpuFeatures
) -> tuple[dict[str, str], str | None]:
    """The binaries among ``relpaths`` (relative to the distribution's location) that the
    engine does not import on ``cpu``, each with the reason, and the one it imports."""
    pick, why = chosen(variants, cpu)
    skipped: dict[str, str] = {}
    picked = None
    for rel in relpaths:
        module = _module_of(rel, variants.package)
        if module is None or module not in variants.modules():
            continue
        if module == pick:
            picked = rel
            continue
        missing = next(
            (
                [f for f in b.needs if f not in cpu.flags]
                for b in variants.builds
                if b.module == module
            ),
            [],
        )
        imports = f"{variants.package}.{pick}" if pick else "none of them"
        reason = f"the engine imports {imports} here ({why})"
        if missing and cpu.machine.lower() in variants.machines:
            reason += f"; {module} needs {', '.join(missing)}, which this CPU lacks"
        skipped[rel] = reason
    return skipped, picked
