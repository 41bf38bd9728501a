"""The GPU side: NVIDIA driver vs the CUDA runtime torch and the engine's extensions were built
for, the GPUs' compute capability vs the architectures compiled into the binaries, and the NCCL
that is really loaded vs the one torch was installed with.

All of it is read from the host and the environment: the driver from ``libcuda``'s
``cuDriverGetVersion`` and ``/proc/driver/nvidia/version``, the GPUs from ``nvidia-smi``, torch's
CUDA from its version file, architectures from torch (``_cuda_getArchFlags``) and from every
extension's ``.nv_fatbin``, the CUDA runtime an extension needs from its ``DT_NEEDED``
(``libcudart.so.12``). On a host without a driver these checks say so and stop.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

from packaging.version import InvalidVersion, Version

from ceiling.envcheck.binaries import ArchList, fatbin_archs, needed_libraries, runs_on
from ceiling.envcheck.envdata import EnvFile
from ceiling.envcheck.models import Driver, EnvProblem, Gpu, Inventory, TorchRuntime
from ceiling.envcheck.requirements import pip_cmd, rebuild_cmd

_NVRM = re.compile(r"Kernel Module(?: for \w+)?\s+([\d.]+)")


def read_driver(proc_version: Path = Path("/proc/driver/nvidia/version")) -> Driver:
    """The kernel driver version and the newest CUDA runtime its ``libcuda`` supports."""
    drv = Driver()
    try:
        m = _NVRM.search(proc_version.read_text())
        if m:
            drv.version = m.group(1)
    except OSError:
        pass
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value:
            drv.cuda = f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except (OSError, AttributeError):
        pass
    return drv


def read_gpus() -> list[Gpu]:
    """Index, name and compute capability of each GPU (``nvidia-smi``; [] without one)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in proc.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and re.fullmatch(r"\d+\.\d+", parts[2]):
            major, minor = parts[2].split(".")
            gpus.append(
                Gpu(index=int(parts[0]), name=parts[1], capability=int(major) * 10 + int(minor))
            )
    return gpus


def _v(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def _tag_for(driver_cuda: str, tags: list[str]) -> str | None:
    """The newest PyTorch CUDA wheel tag (cu126, ...) that a driver supporting ``driver_cuda``
    runs."""
    limit = _v(driver_cuda)
    best = None
    for tag in tags:
        digits = tag[2:]
        v = _v(f"{digits[:-1]}.{digits[-1]}")
        if v is not None and limit is not None and v <= limit and (best is None or v > best[0]):
            best = (v, tag)
    return best[1] if best else None


def check_runtime(
    python: str,
    torch_cuda: str | None,
    torch_version: str | None,
    drv: Driver,
    data: EnvFile,
) -> list[EnvProblem]:
    """torch's CUDA runtime vs what the driver supports."""
    if not torch_cuda or drv.cuda is None:
        return []
    need, have = _v(torch_cuda), _v(drv.cuda)
    if need is None or have is None or have >= need:
        return []
    full = data.cuda_drivers.get(torch_cuda)
    compat_min = data.minor_compat_min.get(str(need.major))
    evidence = [
        f"torch {torch_version} was built for CUDA {torch_cuda} (torch/version.py)",
        f"driver {drv.version or '?'} supports CUDA up to {drv.cuda} (cuDriverGetVersion)",
    ]
    tag = _tag_for(drv.cuda, data.torch_cuda_tags)
    base = (torch_version or "").split("+")[0]
    swap = (
        pip_cmd(
            python,
            "install",
            "--force-reinstall",
            f"torch=={base}",
            "--index-url",
            f"{data.torch_index}/{tag}",
        )
        if tag
        else None
    )
    upgrade = f"upgrade the NVIDIA driver to {full} or newer" if full else "upgrade the driver"
    same_major = need.major == have.major
    drv_v = _v(drv.version)
    if same_major and compat_min and drv_v is not None and drv_v >= _v(compat_min):  # type: ignore[operator]
        return [
            EnvProblem(
                level="warning",
                kind="cuda_minor_compat",
                subject="NVIDIA driver",
                what=(
                    f"torch needs CUDA {torch_cuda}, the driver supports {drv.cuda}: it runs "
                    "through minor-version compatibility, but PTX of newer CUDA cannot be "
                    "JIT-compiled (kernels without a cubin for this GPU fail)"
                ),
                evidence=evidence,
                fix=upgrade + (f", or: {swap}" if swap else ""),
            )
        ]
    return [
        EnvProblem(
            level="error",
            kind="driver_too_old",
            subject="NVIDIA driver",
            what=f"torch needs CUDA {torch_cuda} but the driver supports only CUDA {drv.cuda}",
            evidence=evidence,
            fix=(swap + f"  (or {upgrade})") if swap else upgrade,
        )
    ]


def _cuda_major_needed(path: str) -> int | None:
    for lib in needed_libraries(path):
        m = re.match(r"libcudart\.so\.(\d+)", lib)
        if m:
            return int(m.group(1))
    return None


def check_binaries(
    python: str,
    inv: Inventory,
    runtime: TorchRuntime,
    drv: Driver,
    gpus: list[Gpu],
    binaries: list[tuple[str, str, str]],
) -> list[EnvProblem]:
    """Compute capability vs compiled architectures (torch + extensions), and each extension's
    CUDA runtime major vs the driver's."""
    problems: list[EnvProblem] = []
    caps = sorted({g.capability for g in gpus})
    versions = {d.name: d.version for d in inv.dists}
    if runtime.arch_flags and caps:
        archs = _from_flags(runtime.arch_flags)
        for cap in caps:
            ok, how = runs_on(archs, cap)
            names = ", ".join(g.name for g in gpus if g.capability == cap)
            if not ok:
                problems.append(
                    EnvProblem(
                        level="error",
                        kind="arch_missing",
                        subject=f"torch {runtime.version}",
                        what=(
                            f"torch {runtime.version} has no kernels for compute capability "
                            f"{cap // 10}.{cap % 10} ({names}): {how}"
                        ),
                        evidence=[f"torch._C._cuda_getArchFlags(): {' '.join(runtime.arch_flags)}"],
                        fix=_newer_torch_fix(python, cap),
                    )
                )
    drv_major = int(drv.cuda.split(".")[0]) if drv.cuda else None
    for dist, _loc, path in binaries:
        major = _cuda_major_needed(path)
        if major is not None and drv_major is not None and major > drv_major:
            problems.append(
                EnvProblem(
                    level="error",
                    kind="extension_cuda_too_new",
                    subject=f"{dist} {versions.get(dist, '')}".strip(),
                    what=(
                        f"{Path(path).name} ({dist}) links the CUDA {major} runtime; the driver "
                        f"supports CUDA {drv.cuda}"
                    ),
                    evidence=[f"{path}: NEEDED libcudart.so.{major}"],
                    fix=f"install the {dist} build for CUDA {drv_major}, or upgrade the driver",
                )
            )
        if not caps:
            continue
        compiled = fatbin_archs(path)
        if compiled is None or compiled.empty:
            continue
        for cap in caps:
            ok, how = runs_on(compiled, cap)
            if not ok:
                version = versions.get(dist, "")
                # built only for GPUs newer than this one (vLLM's _qutlass_C: Blackwell FP4):
                # a kernel pack for other hardware, imported only on the paths that need it
                # (seen on an H200 with vLLM 0.25): those paths fail here, the engine runs
                other_hw = all(a > cap for a in [*compiled.sm, *compiled.ptx])
                problems.append(
                    EnvProblem(
                        level="warning" if other_hw else "error",
                        kind="arch_missing",
                        subject=f"{dist} {version}".strip(),
                        what=(
                            f"{Path(path).name} ({dist} {version}) has no kernels for compute "
                            f'capability {cap // 10}.{cap % 10}: {how} ("no kernel image is '
                            'available for execution on the device")'
                        ),
                        evidence=[f"{path}: .nv_fatbin holds {compiled.label()}"],
                        fix=(
                            f'rebuild it for this GPU: TORCH_CUDA_ARCH_LIST="{cap // 10}.{cap % 10}" '
                            + rebuild_cmd(python, dist, version)
                        ),
                    )
                )
    return problems


def _from_flags(flags: list[str]) -> ArchList:
    sm: list[int] = []
    ptx: list[int] = []
    for f in flags:
        m = re.fullmatch(r"(sm|compute)_(\d+)a?", f)
        if m:
            (sm if m.group(1) == "sm" else ptx).append(int(m.group(2)))
    return ArchList(sm=sorted(set(sm)), ptx=sorted(set(ptx)))


def _newer_torch_fix(python: str, cap: int) -> str:
    return f"install a torch built with sm_{cap} (a newer CUDA variant), e.g. " + pip_cmd(
        python,
        "install",
        "--upgrade",
        "torch",
        "--index-url",
        "https://download.pytorch.org/whl/cu128",
    )


def check_nccl(python: str, inv: Inventory, runtime: TorchRuntime) -> list[EnvProblem]:
    """The NCCL really loaded (``/proc/self/maps`` of the probe) vs the nvidia-nccl wheel torch
    was installed with."""
    if not runtime.cuda or not runtime.nccl_version:
        return []
    wheel = next((d for d in inv.dists if d.name.lower().startswith("nvidia-nccl")), None)
    if wheel is None:
        return []
    loaded = runtime.nccl_loaded
    wheel_v = ".".join(wheel.version.split(".")[:3])
    if runtime.nccl_version == wheel_v:
        return []
    outside = [p for p in loaded if wheel.location not in p]
    return [
        EnvProblem(
            level="warning",
            kind="nccl_mismatch",
            subject="NCCL",
            what=(
                f"torch runs NCCL {runtime.nccl_version}, not the {wheel.name} {wheel.version} "
                "it was installed with"
                + (
                    " (another libnccl comes first: LD_LIBRARY_PATH / LD_PRELOAD)"
                    if outside
                    else ""
                )
            ),
            evidence=[f"torch.cuda.nccl.version() = {runtime.nccl_version}"]
            + [f"loaded: {p}" for p in loaded]
            + [f"installed: {wheel.name} {wheel.version} in {wheel.location}"],
            fix=(
                "remove the other libnccl from LD_LIBRARY_PATH / LD_PRELOAD"
                if outside
                else pip_cmd(python, "install", f"{wheel.name}=={wheel.version}")
            ),
        )
    ]
