"""The host side: ``/dev/shm`` for the planned tensor parallelism, open-file limits, and the
hugepage / IOMMU / PCIe ACS settings that decide whether GPUs talk peer-to-peer.

Everything is read from ``/proc`` and ``/sys`` (``lspci`` for ACS, when it is there and there
are several GPUs); nothing is changed. Stale engine segments are counted with the existing
``ceiling.run.shm`` scanner, whose ``ceiling shm --apply`` is the safe clean-up.
"""

from __future__ import annotations

import math
import os
import platform
import re
import resource
import shutil
import subprocess
from pathlib import Path

from ceiling.engines.kernels import CpuFeatures
from ceiling.envcheck.envdata import EnvFile, NofileRule
from ceiling.envcheck.models import EnvProblem
from ceiling.run.shm import scan

MiB = 1 << 20


def cpu_features(cpuinfo: Path = Path("/proc/cpuinfo"), machine: str | None = None) -> CpuFeatures:
    """This CPU's instruction-set flags as the kernel lists them (the ``flags`` line; arm64:
    ``Features``): what it enabled, so what a process may execute."""
    flags: frozenset[str] = frozenset()
    text = _read(cpuinfo) or ""
    m = re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.M)
    if m:
        flags = frozenset(m.group(1).split())
    return CpuFeatures(machine=machine or platform.machine(), flags=flags)


def shm_needed_mib(tp: int, data: EnvFile, env: dict[str, str] | None = None) -> float:
    """Estimated /dev/shm use of ``tp`` ranks on one host (data/env.yaml ``shm``), with the
    variant's ``NCCL_BUFFSIZE`` (the Simple protocol's buffer) and channel bounds applied."""
    if tp <= 1:
        return 0.0
    s = data.shm
    env = env or {}
    per_connection = s.nccl_buffers_mib_per_connection
    channels = s.nccl_channels
    try:
        if env.get("NCCL_BUFFSIZE"):
            per_connection += int(env["NCCL_BUFFSIZE"]) / MiB - s.nccl_simple_buffer_mib
        if env.get("NCCL_MIN_NCHANNELS"):
            channels = max(channels, int(env["NCCL_MIN_NCHANNELS"]))
        if env.get("NCCL_MAX_NCHANNELS"):
            channels = min(channels, int(env["NCCL_MAX_NCHANNELS"]))
    except ValueError:
        pass  # preflight's NCCL value check reports malformed values
    per_rank = per_connection * s.nccl_connections_per_channel * channels
    return tp * per_rank + s.engine_queue_mib


def check_shm(
    root: Path, tp: int, data: EnvFile, env: dict[str, str] | None = None
) -> list[EnvProblem]:
    """Size and free space of ``root`` vs what ``tp`` ranks need; stale segments named."""
    try:
        st = os.statvfs(root)
    except OSError as exc:
        return [
            EnvProblem(
                level="error" if tp > 1 else "warning",
                kind="shm_missing",
                subject=str(root),
                what=f"{root} is not usable ({exc.strerror}): NCCL and engines need it",
                fix="mount a tmpfs there: `mount -t tmpfs -o size=1g tmpfs /dev/shm` "
                "(containers: `docker run --shm-size=1g` or `--ipc=host`)",
            )
        ]
    total = st.f_blocks * st.f_frsize / MiB
    free = st.f_bavail * st.f_frsize / MiB
    need = shm_needed_mib(tp, data, env)
    s = data.shm
    want = max(s.recommended_min_mib, need * s.safety_factor) if tp > 1 else need
    want_gib = max(1, math.ceil(want / 1024))
    evidence = [
        f"{root}: {total:.0f} MiB in all, {free:.0f} MiB free (statvfs)",
        f"TP={tp}: about {need:.0f} MiB for NCCL's shared-memory buffers and the engine's queues "
        "(estimate, data/env.yaml"
        + (f"; NCCL_BUFFSIZE={env['NCCL_BUFFSIZE']}" if env and env.get("NCCL_BUFFSIZE") else "")
        + ")",
    ]
    resize = (
        f"`docker run --shm-size={want_gib}g` (or `--ipc=host`; compose: `shm_size: {want_gib}gb`), "
        f"or on a host: `mount -o remount,size={want_gib}G {root}`"
    )
    problems: list[EnvProblem] = []
    if tp > 1 and total < need:
        problems.append(
            EnvProblem(
                level="error",
                kind="shm_too_small",
                subject=str(root),
                what=(
                    f"{root} holds {total:.0f} MiB; TP={tp} needs about {need:.0f} MiB: NCCL "
                    "fails with 'failed to extend /dev/shm/nccl-...' or a bus error"
                ),
                evidence=evidence,
                fix=resize,
            )
        )
    elif tp > 1 and total < s.recommended_min_mib:
        problems.append(
            EnvProblem(
                level="warning",
                kind="shm_small",
                subject=str(root),
                what=f"{root} holds {total:.0f} MiB, under the 1 GiB NCCL and vLLM recommend",
                evidence=evidence,
                fix=resize,
            )
        )
    if need and free < need and total >= need:
        stale = [seg for seg in scan(root).segments if seg.stale]
        stale_mib = sum(seg.size_bytes for seg in stale) / MiB
        problems.append(
            EnvProblem(
                level="error",
                kind="shm_full",
                subject=str(root),
                what=(
                    f"{root} has {free:.0f} MiB free; TP={tp} needs about {need:.0f} MiB "
                    f"({len(stale)} stale engine segment(s), {stale_mib:.0f} MiB)"
                ),
                evidence=evidence + [seg.path for seg in stale[:5]],
                fix=(
                    "`ceiling shm --apply` (removes only segments no live process has open)"
                    if stale
                    else "stop what fills it (see `ls -la /dev/shm`), or " + resize
                ),
            )
        )
    return problems


def check_nofile(rule: NofileRule, limits: tuple[int, int] | None = None) -> list[EnvProblem]:
    """``ulimit -n`` of this process (what a server started from here inherits)."""
    target, minimum = rule.target, rule.minimum
    soft, hard = limits or resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    if soft == inf or soft >= target:
        return []
    evidence = [f"RLIMIT_NOFILE soft={soft} hard={'unlimited' if hard == inf else hard}"]
    if hard != inf and hard < minimum:
        return [
            EnvProblem(
                level="warning",
                kind="nofile_low",
                subject="ulimit -n",
                what=(
                    f"open files are limited to {soft} (hard limit {hard}): a server with many "
                    "connections fails with 'Too many open files'"
                ),
                evidence=evidence,
                fix=(
                    f"raise the hard limit: `LimitNOFILE={target}` in the systemd unit, "
                    f"`--ulimit nofile={target}:{target}` for docker, or `* hard nofile {target}` "
                    "in /etc/security/limits.conf"
                ),
            )
        ]
    return [
        EnvProblem(
            level="warning" if soft < minimum else "info",
            kind="nofile_soft",
            subject="ulimit -n",
            what=(
                f"open-file limit {soft} (hard {'unlimited' if hard == inf else hard}), under "
                f"the {target} servers are usually given: vLLM raises its own soft limit to the "
                "hard one, other engines do not"
            ),
            evidence=evidence,
            fix=(
                f"`ulimit -n {min(target, hard) if hard != inf else target}` before starting the "
                f"server (systemd: LimitNOFILE={target})"
            ),
        )
    ]


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def check_p2p_hints(
    proc: Path = Path("/proc"), sys: Path = Path("/sys"), gpus: int = 0
) -> tuple[list[EnvProblem], list[str]]:
    """Hugepages, IOMMU and ACS: hints (where readable) that decide GPU peer-to-peer."""
    problems: list[EnvProblem] = []
    facts: list[str] = []
    meminfo = _read(proc / "meminfo") or ""
    hp = re.search(r"HugePages_Total:\s+(\d+)", meminfo)
    size = re.search(r"Hugepagesize:\s+(\d+) kB", meminfo)
    thp = _read(sys / "kernel/mm/transparent_hugepage/enabled")
    if hp:
        facts.append(
            f"hugepages: {hp.group(1)} x {int(size.group(1)) // 1024 if size else '?'} MiB; "
            f"transparent hugepages: {(thp or '?').strip()}"
        )
    cmdline = (_read(proc / "cmdline") or "").split()
    iommu_groups = sys / "kernel/iommu_groups"
    groups = len(list(iommu_groups.iterdir())) if iommu_groups.is_dir() else 0
    iommu_args = [a for a in cmdline if "iommu" in a]
    facts.append(f"IOMMU: {groups} group(s); kernel arguments: {' '.join(iommu_args) or 'none'}")
    if gpus > 1 and groups > 0 and not any(a in ("iommu=pt", "amd_iommu=pt") for a in cmdline):
        problems.append(
            EnvProblem(
                level="warning",
                kind="iommu_translated",
                subject="IOMMU",
                what=(
                    "the IOMMU translates DMA (not pass-through): GPU peer-to-peer may be slow "
                    "or fail (NCCL then falls back to the host)"
                ),
                evidence=[
                    f"{groups} IOMMU groups in {iommu_groups}",
                    f"cmdline: {' '.join(iommu_args) or '(no iommu=)'}",
                ],
                fix="boot with `iommu=pt` (Intel: `intel_iommu=on iommu=pt`), then `nvidia-smi topo -p2p r`",
            )
        )
    if gpus > 1 and shutil.which("lspci"):
        acs = _acs_enabled()
        if acs:
            problems.append(
                EnvProblem(
                    level="warning",
                    kind="acs_enabled",
                    subject="PCIe ACS",
                    what=(
                        f"{len(acs)} PCIe bridge(s) redirect peer-to-peer requests (ACS "
                        "ReqRedir/CmpltRedir on): GPU P2P traffic goes through the root complex"
                    ),
                    evidence=acs[:6],
                    fix="disable ACS on those bridges (NCCL's guide: `setpci -s BDF ECAP_ACS+0x6.w=0000` "
                    "per bridge, or the BIOS setting), then `nvidia-smi topo -p2p r`",
                )
            )
    return problems, facts


def _acs_enabled() -> list[str]:
    try:
        out = subprocess.run(
            ["lspci", "-vvv"], capture_output=True, text=True, timeout=20, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    hits, device = [], ""
    for line in out.splitlines():
        if line and not line[0].isspace():
            device = line.split(" ", 1)[0]
        elif "ACSCtl:" in line and ("ReqRedir+" in line or "CmpltRedir+" in line):
            hits.append(f"{device}: {line.strip()}")
    return hits
