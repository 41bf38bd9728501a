"""The probe group's commands as library functions: check the outputs, measure, save files.

Each returns a typed result; the CLI module parses options, calls one of these and hands the
result to ``ceiling.render.probe``. Tests call them directly too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ceiling.console import Bars, Progress, dumps, say
from ceiling.errors import CeilingError, ExitStatus
from ceiling.inputs import check_out_file
from ceiling.outputs import write_atomic
from ceiling.probe.calibrate import CalibrateConfig, CalibrateResult, run_calibrate
from ceiling.probe.calibrate import to_profile as calibrate_profile
from ceiling.probe.calibrate_ops import OpsConfig, OpsResult, run_ops, to_profile_ops
from ceiling.probe.commbench import CommbenchConfig, CommbenchResult, run_commbench
from ceiling.probe.commbench import to_profile as commbench_profile
from ceiling.probe.telemetry import TelemetrySeries, record
from ceiling.probe.topology import probe
from ceiling.probe.topology_model import Topology
from ceiling.spec.hardware import load_gpu
from ceiling.spec.profile import HardwareProfile, load_profile, save_profile


class TelemetryRun(BaseModel):
    """``ceiling telemetry``: the per-GPU summary and every sample."""

    summary: dict[str, Any]
    series: TelemetrySeries


class CalibrateRun(BaseModel):
    """``ceiling calibrate``: the measurements, the per-op ones (``--ops``), the profile."""

    result: CalibrateResult
    ops: OpsResult | None = None
    profile: HardwareProfile
    # the catalog GPU's HBM bandwidth (the share of it measured is shown; not in the JSON)
    datasheet_GBps: float | None = Field(None, exclude=True)


def _check_outputs(**paths: Path | None) -> None:
    """Every output path is writable before anything is measured (option name -> path)."""
    for option, path in paths.items():
        check_out_file(path, "--" + option)


def _write(path: Path | None, obj: Any) -> None:
    if path is not None:
        write_atomic(path, dumps(obj) + "\n", what="result")
        say(f"wrote {path}")


def probe_to(out: Path | None) -> Topology:
    """``ceiling probe``: the topology (``out``: also saved)."""
    _check_outputs(out=out)
    topo = probe()
    _write(out, topo)
    return topo


def telemetry_to(duration_s: float, interval_ms: float, out: Path | None) -> TelemetryRun:
    """``ceiling telemetry``: sample NVML for ``duration_s`` (``out``: also saved)."""
    if not duration_s > 0 or duration_s == float("inf"):
        raise CeilingError(f"--duration {duration_s:g} is not a positive time", fix="--duration 10")
    if not 10 <= interval_ms <= 1000:
        raise CeilingError(f"--interval-ms {interval_ms:g} is out of range", fix="10 to 1000 ms")
    _check_outputs(out=out)
    series = record(duration_s, interval_ms / 1000)
    if not series.available:
        raise CeilingError(
            f"no telemetry: {series.reason}",
            fix="run on a machine with an NVIDIA driver and `pip install 'ceiling[gpu]'`",
        )
    run = TelemetryRun(summary=series.summary(label="the sampled window"), series=series)
    _write(out, run)
    return run


def commbench_to(
    cfg: CommbenchConfig,
    out: Path | None,
    results: Path | None,
    merge: Path | None,
    progress: bool = True,
) -> CommbenchResult:
    """``ceiling commbench``: every variant and world size; the result (``results``) and the
    profile (``out``, merged into ``merge``) are saved after each variant, so an interrupted
    run keeps what it measured."""
    _check_outputs(out=out, results=results)
    base = load_profile(merge) if merge else None

    def checkpoint(partial: CommbenchResult, final: bool = False) -> None:
        if results is not None:
            write_atomic(results, dumps(partial) + "\n", what="--results")
        if out is not None:
            prof = commbench_profile(partial)
            save_profile(base.merge(prof) if base is not None else prof, out)
        if final:
            for p in (results, out):
                if p is not None:
                    say(f"wrote {p}")

    with Bars("allreduce", enabled=progress) as bars:
        res = run_commbench(cfg, bars.update, checkpoint)
    checkpoint(res, final=True)
    return res


def commbench_exit(res: CommbenchResult) -> ExitStatus:
    """The exit code of a commbench run: CeilingError when every run failed or a sum was
    wrong; 1 when some runs failed."""
    failed = [r.error for r in res.runs if r.error]
    if failed and len(failed) == len(res.runs):
        raise CeilingError(
            f"every commbench run failed; first: {failed[0]}", fix=_nccl_fix(failed[0])
        )
    if not res.all_correct:
        raise CeilingError(
            "an allreduce returned a wrong sum (see the 'check' column)",
            fix="suspect the driver/P2P path of that variant; retry with NCCL_P2P_DISABLE=1",
        )
    return ExitStatus.FAILED if failed else ExitStatus.OK


def _nccl_fix(error: str) -> str:
    if "No module named 'torch'" in error:
        return "install torch in the python that runs the ranks (--python)"
    return "read the quoted rank log lines; NCCL_DEBUG=INFO in --env shows NCCL's own view"


def calibrate_to(
    cfg: CalibrateConfig,
    out: Path | None,
    results: Path | None,
    merge: Path | None,
    ops_cfg: OpsConfig | None = None,
    progress: bool = True,
) -> CalibrateRun:
    """``ceiling calibrate``: measure, fit, save the result (``results``) and the profile
    (``out``, merged into ``merge``)."""
    _check_outputs(out=out, results=results)
    base = load_profile(merge) if merge else None
    ops_res = None
    with Progress("calibrating", enabled=progress) as shown:
        res = run_calibrate(cfg, _status(shown, "calibrate"))
        if ops_cfg is not None:
            ops_res = run_ops(ops_cfg, _status(shown, "calibrate --ops"))
    _write(results, res if ops_res is None else {"calibrate": res, "ops": ops_res})
    prof = calibrate_profile(res)
    if ops_res is not None:
        prof = prof.merge(to_profile_ops(ops_res))
    if base is not None:
        prof = base.merge(prof)
    if out is not None:
        save_profile(prof, out)
        say(f"wrote profile {out}")
    return CalibrateRun(
        result=res, ops=ops_res, profile=prof, datasheet_GBps=_datasheet_bw(prof.gpu)
    )


def _status(shown: Progress, what: str) -> Callable[[str], None]:
    return lambda msg: shown.update(f"{what}: {msg}")


def _datasheet_bw(gpu: str | None) -> float | None:
    if not gpu:
        return None
    try:
        return load_gpu(gpu).mem_bw_GBps
    except CeilingError:  # a measured GPU the catalog does not know: no share to show
        return None
